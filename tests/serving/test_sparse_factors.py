"""A version with sparse factors (an item-kNN's, ``factor_format = csr``) through a real
redis-server: saved and loaded, published in values of at most 1 MiB, and every lookup path
(precomputed, on demand, fold-in, explain, similar, the refresher's write) giving the model's
own scores ``X Vᵀ``; the wire format's checks."""

from __future__ import annotations

import numpy as np
import pytest
import scipy.sparse as sp

from pipeline.serving.artifact import ModelArtifact
from pipeline.serving.fresh import fresh_lists
from pipeline.serving.layout import MAX_VALUE_BYTES, LayoutError
from pipeline.serving.lookup import TopK
from pipeline.serving.publish import publish
from pipeline.serving.sparse_factors import pack_rows, unpack_factor, unpack_rows
from solvers.neighbours import cosine_neighbours, neighbour_rows

N_USERS, N_ITEMS, K = 120, 4000, 60


def _model(seed=0):
    rng = np.random.default_rng(seed)
    dense = (rng.random((N_USERS, N_ITEMS)) < 0.01).astype(np.float32)
    dense[0, :3] = 1.0                                  # user 0 certainly has items
    X = sp.csr_matrix(dense)
    V = neighbour_rows(cosine_neighbours(X, (5.0,), K)[5.0], N_ITEMS, K)
    return X, V


def _expected(X, V, u: int, k: int) -> list[int]:
    s = (X[u] @ V.T).toarray().ravel().astype(np.float32)
    s[X[u].indices] = -np.inf
    return np.lexsort((np.arange(N_ITEMS), -s))[:k].tolist()


def test_a_sparse_version_answers_every_path_with_the_models_scores(tmp_path, redis_url,
                                                                    redis_client):
    X, V = _model()
    art = ModelArtifact.user_item(
        user_ids=np.arange(N_USERS), item_ids=np.arange(N_ITEMS) + 10_000, user_factors=X,
        item_factors=V, seen=X, precompute=np.arange(N_USERS) < 60,
        fold_in={"method": "item_item", "input": "met"})
    art = ModelArtifact.load(art.save(tmp_path / "knn"))       # the bundle keeps it sparse
    assert sp.issparse(art.user_factors) and sp.issparse(art.item_factors)
    assert art.rank == N_ITEMS
    ns = f"sp{tmp_path.name[-10:]}"
    publish("knn", art, redis_client, top_k=20, namespace=ns)
    largest = max(redis_client.strlen(k) for k in redis_client.scan_iter(f"{{{ns}:knn}}*")
                  if redis_client.type(k) == b"string")
    assert largest <= MAX_VALUE_BYTES
    with TopK(redis_url, namespace=ns) as topk:
        for u, source in ((1, "precomputed"), (90, "on_demand")):     # listed, scored
            got = topk.recommend("knn", u, k=10)
            assert got.source == source
            assert [i - 10_000 for i, _ in got.items] == _expected(X, V, u, 10)
        mine = (X[0].indices + 10_000).tolist()
        folded = topk.fold_in("knn", mine, k=10)
        assert [i - 10_000 for i, _ in folded.items] == _expected(X, V, 0, 10)
        item, score = topk.recommend("knn", 0, k=1).items[0]
        why = topk.explain("knn", 0, item, k=50)
        assert why.method == "item_item" and abs(why.residual) < 1e-5
        assert sum(c["term"] for c in why.contributions) == pytest.approx(score, abs=1e-5)
        assert {c["item"] for c in why.contributions} <= set(mine)
        near = topk.similar("knn", int(X[0].indices[0]) + 10_000, k=5)
        assert len(near.items) == 5
        st = topk.versions.current_state("knn")
        assert st.meta["factor_format"] == "csr"
        V_read, _ = topk.lists.factors(st)
    assert (V_read != V).nnz == 0
    # the refresher's lists: what publish wrote, by the same code
    lists = fresh_lists(st, (V_read, None), X[:3].toarray(), [X[u].indices for u in range(3)],
                        20)
    for u in range(3):
        idx = np.frombuffer(lists[u], dtype=[("index", "<i4"), ("score", "<f4")])["index"]
        assert idx[:10].tolist() == _expected(X, V, u, 10)


def test_the_wire_format_is_checked():
    V = sp.csr_matrix(np.array([[0, 2, 0], [1, 0, 3]], np.float32))
    raw = pack_rows(V, 0, 2)
    assert (unpack_rows(raw, "V:0", 2, 3) != V).nnz == 0
    with pytest.raises(LayoutError, match="row counts sum to 3, it holds 2"):
        unpack_rows(raw[:-8], "V:0", 2, 3)
    with pytest.raises(LayoutError, match="names column 2 or 0, the version has rank 2"):
        unpack_rows(raw, "V:0", 2, 2)
    with pytest.raises(LayoutError, match="not .int32 column, float32 value. pairs"):
        unpack_factor(b"abc", "u:x", 3, sparse=True)
