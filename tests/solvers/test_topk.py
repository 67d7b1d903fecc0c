"""The jitted top-K selection and the numpy path against a brute-force argsort reference:
ties, exclusions, rows with fewer eligible items than k, k = 0, NaN/-inf."""

from __future__ import annotations

import numpy as np
import pytest

from solvers import topk as T
from solvers._topk_kernels import block_topk


def _reference(row: np.ndarray, k: int) -> np.ndarray:
    order = np.argsort(-row, kind="stable")
    order = order[row[order] > -np.inf]
    return order[:k]


def _random_case(rng, trial):
    b, n, k = int(rng.integers(1, 12)), int(rng.integers(1, 4000)), int(rng.integers(0, 160))
    if trial % 3 == 0:
        scores = rng.integers(-3, 30, (b, n)).astype(np.float32)  # many ties
    else:
        scores = rng.standard_normal((b, n), dtype=np.float32)
    if trial % 7 == 0:
        scores[:] = 1.0
    if trial % 11 == 0:
        scores[:, ::5] = np.nan
    nnz = rng.integers(0, min(n, 50) + 1, b)
    indptr = np.concatenate([[0], np.cumsum(nnz)]).astype(np.int64)
    indices = np.concatenate([rng.choice(n, c, replace=False) for c in nnz]
                             + [np.zeros(0, int)]).astype(np.int32)
    return scores, indptr, indices, k


@pytest.mark.parametrize("impl", [block_topk, T._block_topk_numpy], ids=["numba", "numpy"])
def test_block_topk_matches_argsort(impl):
    rng = np.random.default_rng(0)
    for trial in range(150):
        scores, indptr, indices, k = _random_case(rng, trial)
        b = scores.shape[0]
        ref = scores.copy()
        out_i = np.full((b, k), -1, np.int32)
        out_s = np.zeros((b, k), np.float32)
        counts = np.zeros(b, np.int32)
        impl(scores, indptr, indices, 0, k, out_i, out_s, counts)
        for r in range(b):
            row = ref[r].copy()
            row[indices[indptr[r]:indptr[r + 1]]] = -np.inf
            row[np.isnan(row)] = -np.inf
            expected = _reference(row, k)
            assert counts[r] == len(expected), trial
            assert np.array_equal(out_i[r, :counts[r]], expected), trial
            assert np.array_equal(out_s[r, :counts[r]], row[expected]), trial


def test_long_rows_with_small_k_match_argsort():
    """The chunk-maxima threshold (rows past 8k entries): catalogue-long rows, small k, the
    top entries in the ragged last chunk, whole chunks of NaN or -inf, few live entries,
    ties at the threshold."""
    rng = np.random.default_rng(7)
    for trial in range(40):
        n, k = int(rng.integers(8_000, 40_000)), int(rng.integers(1, 25))
        row = rng.standard_normal(n).astype(np.float32)
        if trial % 4 == 1:
            row = rng.integers(0, 4, n).astype(np.float32)          # ties everywhere
        if trial % 5 == 2:
            row[n - n % 32:] = 100.0 + np.arange(n % 32)            # best in the last chunk
        if trial % 6 == 3:
            row[: n // 2] = np.nan                                   # whole chunks of NaN
            row[n // 2: n // 2 + 320] = -np.inf
        if trial % 7 == 4:
            live = rng.choice(n, int(rng.integers(0, 2 * k + 1)), replace=False)
            dead = np.full(n, -np.inf, np.float32)
            dead[live] = row[live]
            row = dead                                               # fewer live than k
        scores = row[None, :].copy()
        out_i = np.full((1, k), -1, np.int32)
        out_s = np.zeros((1, k), np.float32)
        counts = np.zeros(1, np.int32)
        block_topk(scores, np.zeros(2, np.int64), np.zeros(0, np.int32), 0, k, out_i, out_s,
                   counts)
        clean = np.where(np.isnan(row), -np.inf, row)
        expected = _reference(clean, k)
        assert counts[0] == len(expected), trial
        assert np.array_equal(out_i[0, :counts[0]], expected), trial
        assert np.array_equal(out_s[0, :counts[0]], clean[expected]), trial


def test_user_blocks_numba_and_numpy_paths_agree(monkeypatch):
    rng = np.random.default_rng(1)
    U = rng.standard_normal((700, 16)).astype(np.float32)
    V = rng.standard_normal((3000, 16)).astype(np.float32)
    b = rng.standard_normal(3000).astype(np.float32)
    nnz = rng.integers(0, 40, 700)
    indptr = np.concatenate([[0], np.cumsum(nnz)])
    indices = np.concatenate([rng.choice(3000, c, replace=False) for c in nnz])
    kw = dict(item_bias=b, seen_indptr=indptr, seen_indices=indices, block=128)
    monkeypatch.setattr(T, "SMALL", 0)
    fast = list(T.user_topk_blocks(U, V, 50, workers=2, **kw))
    monkeypatch.setattr(T, "SMALL", 10**12)
    slow = list(T.user_topk_blocks(U, V, 50, **kw))
    assert [x.start for x in fast] == list(range(0, 700, 128)) == [x.start for x in slow]
    for f, s in zip(fast, slow):
        assert np.array_equal(f.counts, s.counts)
        assert np.array_equal(f.indices, s.indices)
    # and against the full score matrix
    full = U @ V.T + b
    for u in (0, 399, 699):
        row = full[u].copy()
        row[indices[indptr[u]:indptr[u + 1]]] = -np.inf
        blk = fast[u // 128]
        got = blk.indices[u - blk.start]
        assert set(got) == set(np.argsort(-row, kind="stable")[:50])


def test_topk_of_scores_matches_argsort_with_few_nans_and_ties():
    """The one-partition path (k-th largest, then the entries above it and its ties) against
    the reference, where a few NaNs (fewer than k) shift the partition's k-th entry and ties
    at the boundary decide whether that path may answer."""
    rng = np.random.default_rng(5)
    for trial in range(400):
        n, k = int(rng.integers(1, 60)), int(rng.integers(0, 70))
        row = rng.integers(-2, 6, n).astype(np.float32) if trial % 2 else \
            rng.standard_normal(n).astype(np.float32)
        row[rng.choice(n, int(rng.integers(0, min(n, 6) + 1)), replace=False)] = np.nan
        row[rng.choice(n, int(rng.integers(0, min(n, 3) + 1)), replace=False)] = -np.inf
        exclude = rng.choice(n, int(rng.integers(0, 3)), replace=False)
        idx, sc = T.topk_of_scores(row, k, exclude=exclude)
        ref = row.copy()
        ref[exclude] = -np.inf
        ref[np.isnan(ref)] = -np.inf
        expected = _reference(ref, k)
        assert idx.tolist() == expected.tolist(), trial
        assert np.array_equal(sc, ref[expected]), trial


def test_topk_of_scores_orders_ties_by_index():
    idx, sc = T.topk_of_scores(np.array([1, 3, 3, 2, 3], np.float32), 2)
    assert idx.tolist() == [1, 2] and sc.tolist() == [3, 3]
    idx, _ = T.topk_of_scores(np.array([1, 3, 3], np.float32), 5, exclude=[1])
    assert idx.tolist() == [2, 0]


@pytest.mark.parametrize("with_bias", [False, True])
def test_top_k_of_tiny_factors_is_the_same_ranking_scaled(with_bias):
    """A near-collapsed model (factors 2^-70: products 2^-140, subnormal in float32, slow on
    many CPUs and imprecise) gets the ranking of the same model at scale 1, and its scores
    times 2^-140: top-K time and answers do not depend on the factors' scale."""
    rng = np.random.default_rng(3)
    U = rng.standard_normal((600, 8)).astype(np.float32)
    V = rng.standard_normal((700, 8)).astype(np.float32)
    # a bias of few significant bits, so that times 2^-140 (subnormal) it is still exact
    bias = (np.round(rng.standard_normal(700) * 16) / 16).astype(np.float32) if with_bias \
        else None
    items, scores = T.user_topk(U, V, 10, item_bias=bias, workers=2)
    tiny_bias = None if bias is None else np.ldexp(bias, -140)
    tiny_items, tiny_scores = T.user_topk(np.ldexp(U, -70), np.ldexp(V, -70), 10,
                                          item_bias=tiny_bias, workers=2)
    assert np.array_equal(items, tiny_items)
    assert np.array_equal(np.ldexp(scores.astype(np.float32), -140),
                          tiny_scores.astype(np.float32))


@pytest.mark.parametrize("layout", ["C", "F", "strided", "float64"])
def test_item_factors_of_any_layout_give_the_same_lists(layout):
    """Whatever the layout of V (the refresher passes a cached Vᵀ's transpose, a blend a
    concatenation, a caller float64), the lists and scores are the same, bit for bit: the
    refresher's lists must be the ones the publisher wrote."""
    rng = np.random.default_rng(4)
    U = rng.standard_normal((300, 12)).astype(np.float32)
    V = rng.standard_normal((900, 24)).astype(np.float32)
    want_items, want_scores = T.user_topk(U, np.ascontiguousarray(V[:, ::2]), 15, workers=2)
    given = {"C": np.ascontiguousarray(V[:, ::2]), "F": np.asfortranarray(V[:, ::2]),
             "strided": V[:, ::2], "float64": V[:, ::2].astype(np.float64)}[layout]
    items, scores = T.user_topk(U, given, 15, workers=2)
    assert np.array_equal(items, want_items) and np.array_equal(scores, want_scores)


def test_wide_sparse_user_rows_rank_as_the_dense_product():
    """An item-item model's user rows (0/1 met items, thousands of columns) are multiplied
    sparsely: the same lists and scores as the dense product, up to the last bit."""
    import scipy.sparse as sp

    from solvers.topk import SMALL, dense_pairs, user_topk

    rng = np.random.default_rng(0)
    n_users, width, n_items = 3000, 600, 900
    assert n_users * n_items > SMALL
    U = np.zeros((n_users, width), np.float32)
    for u in range(n_users):
        U[u, rng.choice(width, 5, replace=False)] = 1.0
    V = rng.standard_normal((n_items, width)).astype(np.float32)
    VT = np.ascontiguousarray(V.T)
    assert sp.issparse(dense_pairs(U, VT)[0][0])
    assert len(dense_pairs(np.ones((4, 600), np.float32), VT)) == 1
    # a blend's factors: a dense rank-8 model beside the 0/1 columns, split in two products
    blend = np.hstack([rng.standard_normal((n_users, 8)).astype(np.float32), U])
    V_blend = np.hstack([rng.standard_normal((n_items, 8)).astype(np.float32), V])
    pairs = dense_pairs(blend, np.ascontiguousarray(V_blend.T))
    assert [sp.issparse(p[0]) for p in pairs] == [False, True]
    for U_, V_ in ((U, V), (blend, V_blend)):
        items, scores = user_topk(U_, V_, 10)
        dense = U_ @ V_.T
        expected = np.argsort(-dense, axis=1, kind="stable")[:, :10]
        assert np.allclose(scores, np.take_along_axis(dense, expected, 1), rtol=1e-5,
                           atol=1e-5)
        assert (items == expected).mean() > 0.999      # a near-tie may order two items apart


def test_one_list_for_everyone_ranks_as_the_per_user_scores():
    """A popularity-like list (one score per item, many ties) with each user's seen items
    left out: sorted once, the same lists and scores as scoring every user's row."""
    from solvers.topk import global_topk, user_topk

    rng = np.random.default_rng(3)
    n_users, n_items, k = 400, 300, 10
    scores = rng.integers(0, 20, n_items).astype(np.float32)       # ties everywhere
    seen = [np.sort(rng.choice(n_items, rng.integers(0, 40), replace=False))
            for _ in range(n_users)]
    seen[0] = np.arange(n_items - 5)                                # fewer than k remain
    indptr = np.r_[0, np.cumsum([len(s) for s in seen])]
    indices = np.concatenate(seen).astype(np.int32)
    want_items, want_scores = user_topk(np.ones((n_users, 1), np.float32), scores[:, None], k,
                                        seen_indptr=indptr, seen_indices=indices)
    items, got_scores = global_topk(scores, k, seen_indptr=indptr, seen_indices=indices)
    assert np.array_equal(items, want_items)
    assert np.array_equal(got_scores, want_scores)
    assert (items[0] >= 0).sum() == 5


def test_sparse_products_are_ranked_as_their_dense_rows():
    """The sparse kernel (an item-kNN's score rows ``X Vᵀ``, summed and ranked without a
    dense row) against the dense selection of scipy's product: positive entries, zeros in
    column order (absent, stored, or sums that cancel), negative entries; ties by the lower
    column; NaN and seen columns out; rows from an offset; the scratch left clean; rows that
    touch few columns (ranked from them) and many (ranked as the dense row)."""
    import scipy.sparse as sp

    from solvers._topk_kernels import DENSE_SHARE, sparse_product_topk
    from solvers.topk import _block_topk_numpy

    rng = np.random.default_rng(0)
    long_rows = short_rows = 0      # rows ranked as dense rows, and from their columns
    for trial in range(60):
        n_users, inner = 24, int(rng.integers(1, 30))
        n_items = int(rng.integers(5, 60) if trial % 2 else rng.integers(200, 400))
        k, start = int(rng.integers(1, 15)), int(rng.integers(0, 8))
        A, B = (sp.random(*shape, density=rng.random() * (0.5 if j == 0 or trial % 2
                                                          else 0.05),
                          random_state=trial + 50 * j, format="csr", dtype=np.float32)
                for j, shape in enumerate([(n_users, inner), (inner, n_items)]))
        touched = np.diff((abs(A) @ abs(B)).tocsr().indptr)[start:]
        long_rows += int((touched > n_items // DENSE_SHARE).sum())
        short_rows += int((touched <= n_items // DENSE_SHARE).sum())
        A.data = np.round((rng.random(A.nnz) - 0.3) * 4).astype(np.float32)  # ties, 0, < 0
        B.data = np.round((rng.random(B.nnz) - 0.5) * 4).astype(np.float32)  # sums cancel
        if trial % 5 == 0 and B.nnz:
            B.data[0] = np.nan
        seen = sp.random(n_users, n_items, density=0.2, random_state=100 + trial, format="csr")
        ip, ix = seen.indptr.astype(np.int64), seen.indices.astype(np.int32)
        rows = n_users - start
        got = (np.empty((rows, k), np.int32), np.empty((rows, k), np.float32),
               np.empty(rows, np.int32))
        mark = np.zeros(n_items, np.int8)
        sparse_product_topk(A.indptr.astype(np.int64), A.indices, A.data,
                            B.indptr.astype(np.int64), B.indices, B.data, start, n_items,
                            ip, ix, k, *got, mark)
        want = (np.empty((rows, k), np.int32), np.empty((rows, k), np.float32),
                np.empty(rows, np.int32))
        dense = (A @ B).toarray()[start:]
        _block_topk_numpy(np.where(np.isnan(dense), -np.inf, dense), ip, ix, start, k, *want)
        np.testing.assert_array_equal(got[2], want[2])
        for r, n in enumerate(want[2].tolist()):
            np.testing.assert_array_equal(got[0][r, :n], want[0][r, :n])
            np.testing.assert_array_equal(got[1][r, :n], want[1][r, :n])
        assert not mark.any()
    assert long_rows > 100 and short_rows > 100, (long_rows, short_rows)


def test_sparse_products_summed_by_the_kernel_are_scipys_bits(monkeypatch):
    """Past SMALL scores an item-kNN's sparse product is summed by a kernel straight into the
    score rows: every score is scipy's float32 sum, bit for bit, added onto a dense part."""
    import scipy.sparse as sp

    rng = np.random.default_rng(3)
    U = sp.random(40, 300, density=0.05, format="csr", dtype=np.float32, random_state=rng)
    VT = sp.random(300, 500, density=0.2, format="csr", dtype=np.float32, random_state=rng)
    dense = rng.standard_normal((40, 500)).astype(np.float32)
    rows = slice(7, 29)
    want = dense[rows] + (U[rows] @ VT).toarray()
    monkeypatch.setattr(T, "SMALL", 0)
    got = dense[rows].copy()
    T._add_product(U, rows, VT, got)
    assert np.array_equal(got.view(np.uint32), want.view(np.uint32))
    out = np.full((22, 500), np.nan, np.float32)
    T.factor_scores(U, rows, VT, out)
    assert np.array_equal(out, (U[rows] @ VT).toarray())
    VT_dense = rng.standard_normal((300, 500)).astype(np.float32)   # EASE's, a blend's part
    want = dense[rows] + U[rows] @ VT_dense
    got = dense[rows].copy()
    T._add_product(U, rows, VT_dense, got)
    assert np.array_equal(got.view(np.uint32), want.view(np.uint32))
