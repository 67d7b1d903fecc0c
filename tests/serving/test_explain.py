"""``TopK.explain`` and ``GET /v1/models/{m}/explain`` through a real redis-server: for every
shape a ``user_item`` version serves (AltSVM's pairwise fold-in, implicit's ALS, EASE, a
blend), the terms add up to the served score (with the bias and the residual), the terms are
what a direct recomputation gives (implicit's own ``explain`` for ALS, the duals of the
pairwise problem, B's entries for EASE, each part's own for a blend), and a user whose factor
the refresher rewrote by the same fold-in has no residual."""

from __future__ import annotations

import socket
import threading
import time
from contextlib import contextmanager

import httpx
import numpy as np
import pytest
from scipy.sparse import csr_matrix

from pipeline.serving import layout as L
from pipeline.serving.api import create_app
from pipeline.serving.artifact import ModelArtifact
from pipeline.serving.explain import UnknownUserError
from pipeline.serving.fresh import FreshUser, fresh_answer_parts, write_fresh
from pipeline.serving.item_queries import UnknownItemError, fold_in_method
from pipeline.serving.lookup import TopK
from pipeline.serving.publish import publish
from solvers.fold_in import implicit_pairs, least_squares_fold_in, pairwise_fold_in

N_USERS, N_ITEMS = 40, 30
PAIRWISE = {"method": "pairwise", "reg": 2.0, "loss": "squared_hinge", "per_item": 4}
ALS = {"method": "least_squares", "reg": 0.5, "alpha": 5.0}


def _met(seed: int = 0) -> csr_matrix:
    """A binary users x items matrix, every user with 3..9 items."""
    rng = np.random.default_rng(seed)
    rows = [rng.choice(N_ITEMS, rng.integers(3, 10), replace=False) for _ in range(N_USERS)]
    indptr = np.r_[0, np.cumsum([len(r) for r in rows])]
    return csr_matrix((np.ones(indptr[-1], np.float32), np.concatenate(rows), indptr),
                      shape=(N_USERS, N_ITEMS))


def _artifact(X, U, V, b, fold_in, **kw) -> ModelArtifact:
    return ModelArtifact.user_item(
        user_ids=[f"user-{u}" for u in range(N_USERS)], item_ids=np.arange(N_ITEMS) * 3 + 100,
        user_factors=U, item_factors=V, item_bias=b, seen=(X.indptr, X.indices),
        fold_in=fold_in, algorithm="test", **kw)


def _als(X):
    from implicit.cpu.als import AlternatingLeastSquares
    from threadpoolctl import threadpool_limits

    with threadpool_limits(1, "blas"):
        als = AlternatingLeastSquares(factors=6, regularization=ALS["reg"], alpha=ALS["alpha"],
                                      iterations=8, random_state=0, num_threads=1)
        als.fit(X, show_progress=False)
    return als


@pytest.fixture
def served(redis_url, tmp_path):
    """``publish(model, artifact)`` into a namespace of this test, and its TopK."""
    namespace = f"explain{tmp_path.name[-8:]}"
    topk = TopK(redis_url, namespace=namespace, timeout=5.0)

    def put(model: str, art: ModelArtifact) -> TopK:
        publish(model, art, redis_url, top_k=N_ITEMS, namespace=namespace)
        return topk

    yield put
    topk.close()


@contextmanager
def serve_app(app):
    """``app`` served by uvicorn on a free loopback port in a thread of this process; yields
    its base URL."""
    import uvicorn

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port,
                                           log_level="warning", access_log=False))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    try:
        for _ in range(200):
            if server.started:
                break
            time.sleep(0.05)
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(timeout=10)


def _adds_up(e, listed_score: float | None = None) -> None:
    """Σ terms + bias + residual is the score, and the score the one the lists serve."""
    total = sum(c["term"] for c in e.contributions) + e.rest + e.bias + e.residual
    assert total == pytest.approx(e.score, rel=1e-9, abs=1e-9)
    if listed_score is not None:
        assert e.score == pytest.approx(listed_score, rel=1e-5, abs=1e-5)
    assert all(c["share"] == pytest.approx(c["term"] / e.score) for c in e.contributions)


def _refresh(topk, model: str, user: str, factor, seen) -> None:
    """Rewrite ``user``'s keys as the refresher does, with ``factor`` and ``seen``."""
    st = topk.versions.current_state(model)
    pairs = fresh_answer_parts(st, topk.lists.factors(st), factor, seen, st.top_k)
    assert write_fresh(topk.transport.client, st.keys, st.version, st.publish_id,
                       [FreshUser(L.key_of(user), np.asarray(factor, np.float32),
                                  np.asarray(seen, np.int32), pairs, 1)]) == [True]


def test_als_terms_are_implicits_explain_and_add_up_to_the_served_score(served):
    X = _met(1)
    als = _als(X)
    U, V = np.asarray(als.user_factors), np.asarray(als.item_factors)
    topk = served("als", _artifact(X, U, V, None, ALS))
    row = 7
    met = X.indices[X.indptr[row]:X.indptr[row + 1]]
    listed = topk.recommend("als", f"user-{row}", k=5)
    for item, score in listed.items:
        i = (item - 100) // 3
        e = topk.explain("als", f"user-{row}", item, k=N_ITEMS)
        assert e.method == "least_squares" and e.factor == "published" and e.n_terms == len(met)
        _adds_up(e, score)
        total, top, _ = als.explain(row, X, i, N=len(met))     # implicit's own
        assert {c["item"]: c["term"] for c in e.contributions} == pytest.approx(
            {int(j) * 3 + 100: s for j, s in top}, rel=1e-4, abs=1e-6)
        # the residual is what the served (trained) factor holds beyond the recomputation
        assert e.residual == pytest.approx(score - total, rel=1e-4, abs=1e-5)
        assert sorted(e.history) == sorted(int(j) * 3 + 100 for j in met)
    # the refresher's factor for the same items is the recomputed one: no residual left
    u = least_squares_fold_in(V, met, reg=ALS["reg"], alpha=ALS["alpha"])
    _refresh(topk, "als", f"user-{row}", u, met)
    item = topk.recommend("als", f"user-{row}", k=1).items[0][0]
    e = topk.explain("als", f"user-{row}", item, k=3)
    assert e.factor == "fresh" and len(e.contributions) == 3
    _adds_up(e)
    assert abs(e.residual) < 1e-5 * max(1.0, abs(e.score))


def _pairwise_reference(V, b, met, spec, i) -> dict:
    """Per met item: Σ over its implicit comparisons of α_c (v_w − v_l)·v_i / λ, α from the
    squared hinge's stationarity at the fold-in's factor (plain numpy)."""
    rows = implicit_pairs(met, len(V), spec["per_item"])
    V64, b64 = V.astype(np.float64), b.astype(np.float64)
    u = pairwise_fold_in(V64, b64, rows, reg=spec["reg"], loss=spec["loss"])
    out = {}
    for w, lo in rows:
        d = V64[w] - V64[lo]
        alpha = 2 * max(0.0, 1 - d @ u - (b64[w] - b64[lo]))
        out[int(w)] = out.get(int(w), 0.0) + alpha * (d @ V64[i]) / spec["reg"]
    return out


@pytest.mark.parametrize("loss", ["squared_hinge", "hinge"])
def test_altsvm_terms_are_the_comparisons_duals(served, loss):
    rng = np.random.default_rng(2)
    X = _met(2)
    U, V, b = (rng.normal(size=(N_USERS, 5)), rng.normal(size=(N_ITEMS, 5)) * 0.5,
               rng.normal(size=N_ITEMS) * 0.1)
    spec = {**PAIRWISE, "loss": loss}
    topk = served("altsvm", _artifact(X, U, V, b, spec))
    row = 3
    met = X.indices[X.indptr[row]:X.indptr[row + 1]]
    V32, b32 = V.astype(np.float32), b.astype(np.float32)
    for item, score in topk.recommend("altsvm", f"user-{row}", k=4).items:
        i = (item - 100) // 3
        e = topk.explain("altsvm", f"user-{row}", item, k=N_ITEMS)
        _adds_up(e, score)
        assert all(c["comparisons"] == spec["per_item"] for c in e.contributions)
        u = fold_in_method("pairwise").user_factor(topk.versions.current_state("altsvm"),
                                                   V32, b32, met, np.zeros((0, 2), int), spec)
        # the terms add up to the fold-in's score: the residual is the trained factor's rest
        explained = sum(c["term"] for c in e.contributions) + e.rest
        assert explained == pytest.approx(float(V32[i] @ u), rel=1e-4, abs=1e-4)
        if loss == "squared_hinge":
            ref = _pairwise_reference(V32, b32, met, spec, i)
            assert {c["item"]: c["term"] for c in e.contributions} == pytest.approx(
                {j * 3 + 100: t for j, t in ref.items()}, rel=1e-6, abs=1e-8)
    _refresh(topk, "altsvm", f"user-{row}", u, met)
    e = topk.explain("altsvm", f"user-{row}", item, k=2)
    assert e.factor == "fresh" and len(e.contributions) == 2 and e.n_terms == len(met)
    _adds_up(e)
    assert abs(e.residual) < 1e-4 * max(1.0, abs(e.score))


def test_ease_terms_are_the_item_weights_of_the_met_items(served):
    from pipeline.training.trainers.ease import ease_weights, factors

    X = _met(3)
    B = ease_weights(X, 4.0)
    U, V, _ = factors(X, B)
    topk = served("ease", _artifact(X, U, V, None, {"method": "item_item"}))
    row = 11
    met = X.indices[X.indptr[row]:X.indptr[row + 1]]
    for item, score in topk.recommend("ease", f"user-{row}", k=3).items:
        i = (item - 100) // 3
        e = topk.explain("ease", f"user-{row}", item, k=N_ITEMS)
        _adds_up(e, score)
        assert abs(e.residual) < 1e-5 and e.method == "item_item"
        assert {c["item"]: c["term"] for c in e.contributions} == pytest.approx(
            {int(j) * 3 + 100: float(B[j, i]) for j in met}, rel=1e-6, abs=1e-7)


def test_a_blend_splits_by_its_weights_into_its_parts_terms(served):
    from pipeline.training.trainers.blends import blend, blend_fold_in, blend_scales

    rng = np.random.default_rng(4)
    X = _met(4)
    als = _als(X)
    first = (rng.normal(size=(N_USERS, 4)), rng.normal(size=(N_ITEMS, 4)) * 0.5,
             rng.normal(size=N_ITEMS) * 0.1)
    second = (np.asarray(als.user_factors), np.asarray(als.item_factors), None)
    U, V, b = blend(first, second, 0.25)
    scales = blend_scales(first, second, 0.25)
    spec = blend_fold_in(PAIRWISE, ALS, (4, 6), scales)
    topk = served("blend", _artifact(X, U, V, b, spec))
    row = 5
    met = X.indices[X.indptr[row]:X.indptr[row + 1]]
    item, score = topk.recommend("blend", f"user-{row}", k=1).items[0]
    e = topk.explain("blend", f"user-{row}", item, k=100)
    _adds_up(e, score)
    assert {c["part"] for c in e.contributions} == {0, 1} and e.n_terms == 2 * len(met)
    # each part's terms are the part's own explanation, times its scale
    i = (item - 100) // 3
    _, top, _ = als.explain(row, X, i, N=len(met))
    als_terms = {c["item"]: c["term"] for c in e.contributions if c["method"] == "least_squares"}
    assert als_terms == pytest.approx({int(j) * 3 + 100: scales[1] * s for j, s in top},
                                      rel=1e-3, abs=1e-6)
    ref = _pairwise_reference(V[:, :4].astype(np.float32), (b / scales[0]).astype(np.float32),
                              met, PAIRWISE, i)
    pair_terms = {c["item"]: c["term"] for c in e.contributions if c["method"] == "pairwise"}
    assert pair_terms == pytest.approx({j * 3 + 100: scales[0] * t for j, t in ref.items()},
                                       rel=1e-3, abs=1e-6)
    st = topk.versions.current_state("blend")
    u = fold_in_method("blend").user_factor(st, *topk.lists.factors(st), met,
                                            np.zeros((0, 2), int), spec)
    _refresh(topk, "blend", f"user-{row}", u, met)
    e = topk.explain("blend", f"user-{row}", item, k=3)
    _adds_up(e)
    assert e.factor == "fresh" and abs(e.residual) < 1e-4 * max(1.0, abs(e.score))


def test_unknown_users_and_items_and_versions_without_history(served):
    rng = np.random.default_rng(5)
    X = _met(5)
    topk = served("movies", _artifact(X, rng.normal(size=(N_USERS, 3)),
                                      rng.normal(size=(N_ITEMS, 3)), None, PAIRWISE))
    with pytest.raises(UnknownUserError, match="did you mean 'user-4'"):
        topk.explain("movies", "USER-4", 100)
    with pytest.raises(UnknownUserError, match="fallback list"):
        topk.explain("movies", "nobody", 100)
    with pytest.raises(UnknownItemError, match=r"item '1000' is not .* did you mean '100'"):
        topk.explain("movies", "user-4", 1000)
    served("top", ModelArtifact.global_list(item_ids=np.arange(5), scores=np.arange(5.0),
                                            served_as="trivial"))
    e = topk.explain("top", "anyone", 3)
    assert e.contributions == [] and "trivial list" in e.note and "no user history" in e.note
    assert e.score == pytest.approx(3.0)
    with serve_app(create_app(topk, models=["movies", "top"])) as base, \
            httpx.Client(base_url=base, timeout=10) as http:
        ok = http.get("/v1/models/movies/explain", params={"user": "user-4", "item": 103,
                                                           "k": 2})
        body = ok.json()
        assert ok.status_code == 200 and len(body["contributions"]) == 2
        assert set(body) >= {"model", "user", "item", "version", "score", "contributions",
                             "rest", "bias", "residual", "computed", "factor", "history"}
        assert body["score"] == pytest.approx(sum(c["term"] for c in body["contributions"])
                                              + body["rest"] + body["bias"] + body["residual"])
        missing = http.get("/v1/models/movies/explain", params={"user": "USER-4", "item": 103})
        assert missing.status_code == 404 and "did you mean 'user-4'" in missing.json()["error"]
        assert http.get("/v1/models/movies/explain", params={
            "user": "user-4", "item": "x"}).status_code == 404
        assert http.get("/v1/models/movies/explain", params={
            "user": "user-4", "item": 103, "k": 0}).status_code == 400
        assert http.get("/v1/models/movies/explain", params={"user": "user-4"}).status_code \
            == 400
        assert "did you mean 'movies'" in http.get("/v1/models/movie/explain", params={
            "user": "u", "item": 1}).json()["error"]
        plain = http.get("/v1/models/top/explain", params={"user": "a", "item": 3})
        assert plain.status_code == 200 and "no user history" in plain.json()["note"]
