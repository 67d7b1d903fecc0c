"""Item-kNN neighbours (:mod:`solvers.neighbours`) against a dense float64 reference: the
similarities, the k kept per item and their order (ties by lower index), the same on any
number of threads and with any shrinkages ranked together, and inputs refused with both values."""

from __future__ import annotations

import numba
import numpy as np
import pytest
import scipy.sparse as sp

from solvers.neighbours import cosine_neighbours, neighbour_rows
from solvers.topk import user_topk


def _binary(n_users=80, n_items=60, density=0.08, seed=0):
    rng = np.random.default_rng(seed)
    return sp.csr_matrix((rng.random((n_users, n_items)) < density).astype(np.float32))


def _reference(X, shrink: float, k: int) -> np.ndarray:
    """Dense V: row j holds j's k most similar other items sharing a user (similarity desc,
    index asc), sim = c_ij / (sqrt(c_ii c_jj) + shrink), in float64."""
    Xd = X.toarray().astype(np.float64)
    C = Xd.T @ Xd
    norm = np.sqrt(np.diag(C))
    S = C / (np.outer(norm, norm) + shrink)
    n = X.shape[1]
    V = np.zeros((n, n))
    for j in range(n):
        cand = [i for i in range(n) if i != j and C[i, j] > 0]
        cand.sort(key=lambda i: (-S[i, j], i))
        for i in cand[:k]:
            V[j, i] = S[i, j]
    return V


@pytest.mark.parametrize("shrink,k", [(0.0, 1), (0.0, 5), (10.0, 5), (100.0, 60)])
def test_neighbours_match_a_dense_reference(shrink, k):
    X = _binary()
    V = neighbour_rows(cosine_neighbours(X, (shrink,), k)[shrink], X.shape[1], k)
    assert V.dtype == np.float32 and V.shape == (60, 60)
    want = _reference(X, shrink, k)
    np.testing.assert_array_equal(V.toarray() != 0, want != 0)
    np.testing.assert_allclose(V.toarray(), want, rtol=1e-6)
    assert np.diff(V.indptr).max() <= k


def test_ties_keep_the_lower_index_and_k_slices_the_longest_lists():
    # items 1, 2, 3 are each met by user 0 alone, with item 0: equal similarities to 0
    X = sp.csr_matrix(np.array([[1, 1, 1, 1], [1, 0, 0, 0]], np.float32))
    nbr = cosine_neighbours(X, (0.0,), 3)[0.0]
    assert neighbour_rows(nbr, 4, 1)[0].indices.tolist() == [1]
    V3 = neighbour_rows(nbr, 4, 3)
    assert sorted(V3[0].indices.tolist()) == [1, 2, 3]
    for k in (1, 2):     # the first k of the k_max lists are the k lists
        again = cosine_neighbours(X, (0.0,), k)[0.0]
        assert (neighbour_rows(again, 4, k) != neighbour_rows(nbr, 4, k)).nnz == 0


def test_threads_and_shrinkages_ranked_together_change_nothing():
    # Zipf-like columns: a few items co-occur with nearly every other one
    rng = np.random.default_rng(3)
    n_users, n_items = 200, 90
    p = 1.0 / np.arange(1, n_items + 1)
    X = sp.csr_matrix((rng.random((n_users, n_items)) < 0.6 * p / p.max() + 0.02)
                      .astype(np.float32))
    shrinks = (0.0, 5.0, 50.0)
    together = cosine_neighbours(X, shrinks, 7)
    previous = numba.get_num_threads()
    try:
        numba.set_num_threads(1)
        for s in shrinks:
            alone = cosine_neighbours(X, (s,), 7)[s]
            for a, b in zip(alone, together[s]):
                np.testing.assert_array_equal(a, b)
            want = _reference(X, s, 7)
            np.testing.assert_allclose(neighbour_rows(alone, n_items, 7).toarray(), want,
                                       rtol=1e-6)
    finally:
        numba.set_num_threads(previous)


def test_repeated_entries_count_a_user_once():
    X = sp.csr_matrix(np.array([[1, 1, 0], [0, 1, 1]], np.float32))
    repeated = sp.csr_matrix((np.ones(5, np.float32), ([0, 0, 0, 1, 1], [0, 1, 1, 1, 2])),
                             shape=(2, 3))
    repeated.has_canonical_format = False
    want = neighbour_rows(cosine_neighbours(X, (0.0,), 2)[0.0], 3, 2)
    got = neighbour_rows(cosine_neighbours(repeated, (0.0,), 2)[0.0], 3, 2)
    np.testing.assert_array_equal(got.toarray(), want.toarray())


def test_scores_are_the_sum_over_a_users_items_and_topk_agrees_with_dense():
    X = _binary(n_users=40, n_items=300, density=0.03, seed=4)
    V = neighbour_rows(cosine_neighbours(X, (10.0,), 20)[10.0], 300, 20)
    sparse_items, sparse_scores = user_topk(X, V, 10, seen_indptr=X.indptr,
                                            seen_indices=X.indices)
    dense_items, dense_scores = user_topk(X.toarray(), V.toarray(), 10, seen_indptr=X.indptr,
                                          seen_indices=X.indices)
    np.testing.assert_array_equal(sparse_items, dense_items)
    np.testing.assert_allclose(sparse_scores, dense_scores, rtol=1e-6)


def test_bad_inputs_are_refused_with_their_values():
    X = _binary()
    with pytest.raises(ValueError, match="k_max is 0, expected at least 1"):
        cosine_neighbours(X, (0.0,), 0)
    with pytest.raises(ValueError, match=r"shrinks are \[-1.0\], expected finite values >= 0"):
        cosine_neighbours(X, (-1.0,), 5)
