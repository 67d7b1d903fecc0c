"""AltSVM's parallel layout passes and parallel rebuilds, each against a serial numpy or
plain-Python reference, on several span/block/part counts and thread counts (issue #17)."""

from __future__ import annotations

import warnings

import numba
import numpy as np
import pytest

from solvers import AltSVM
from solvers import _altsvm_kernels as K
from solvers import _altsvm_layout as L
from solvers import _altsvm_solver as S
from solvers._base import numba_threads
from solvers.altsvm import _check_comparisons

TWO_THREADS = pytest.mark.skipif(numba.config.NUMBA_NUM_THREADS < 2,
                                 reason="needs 2 numba threads")


def comparisons(seed=0, n_users=50, n_items=30, n=3000, heavy=True):
    """Random (user, winner, loser) rows in random order; some users have none, one has many
    (a long row of the entries table and its own block)."""
    rng = np.random.default_rng(seed)
    u = rng.integers(0, n_users, n)
    if heavy:
        u[rng.random(n) < 0.3] = 7
    u[u == 3] = 4  # user 3 has no comparisons
    w = rng.integers(0, n_items, n)
    lo = (w + rng.integers(1, n_items, n)) % n_items
    return np.column_stack([u, w, lo])


def entries_reference(c_sorted, n_users):
    """Per user, distinct items numbered by first appearance (winner before loser)."""
    entry_ptr, entry_item, pos_w, pos_l = [0], [], [], []
    for i in range(n_users):
        slot = {}
        for _, w, lo in c_sorted[c_sorted[:, 0] == i]:
            for item, out in ((w, pos_w), (lo, pos_l)):
                if item not in slot:
                    slot[item] = len(entry_item)
                    entry_item.append(item)
                out.append(slot[item])
        entry_ptr.append(len(entry_item))
    return [np.array(a) for a in (entry_ptr, entry_item, pos_w, pos_l)]


# ------------------------------------------------------------------------------ validation


@pytest.mark.parametrize("spans", [1, 2, 3, 8])
@pytest.mark.parametrize("dtype, order", [(np.int64, "C"), (np.int32, "C"), (np.int64, "F")])
def test_check_ids_matches_numpy(spans, dtype, order):
    rng = np.random.default_rng(spans)
    for trial in range(6):
        c = np.array(comparisons(trial, n=257), dtype=dtype, order=order)
        if trial % 2:
            c[rng.integers(0, len(c), 3), 2] = -rng.integers(1, 5)
        if trial % 3:
            rows = rng.integers(0, len(c), 2)
            c[rows, 2] = c[rows, 1]
        low, same, top_u, top_i = L.check_ids(c[:, 0], c[:, 1], c[:, 2], spans)
        hits = np.flatnonzero(c[:, 1] == c[:, 2])
        assert low == min(0, c.min())
        assert same == (hits[0] if hits.size else -1)
        assert top_u == c[:, 0].max() and top_i == c[:, 1:].max()


def test_validation_takes_int32_fortran_and_float_input_alike():
    c = comparisons(1)
    c = c[c[:, 1] != c[:, 2]]
    fits = []
    for variant in (c, c.astype(np.int32), np.asfortranarray(c), c.astype(float)):
        checked, n_users, n_items = _check_comparisons(variant, None, None)
        assert (n_users, n_items) == (50, 30)
        assert checked.dtype in (np.int32, np.int64)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            fits.append(AltSVM(rank=2, reg=5.0, max_iter=3, n_threads=1,
                               random_state=0).fit(variant))
    for m in fits[1:]:
        assert np.array_equal(m.user_factors_, fits[0].user_factors_)
        assert np.array_equal(m.item_factors_, fits[0].item_factors_)
    # the caller's array is neither copied for the checks nor kept by the model
    checked, _, _ = _check_comparisons(c, None, None)
    assert checked is c
    assert not np.shares_memory(fits[0]._comparisons, c)
    state = fits[0].warm_state()
    assert all(state[k].dtype == np.int64 for k in ("user", "winner", "loser"))


# ------------------------------------------------------------------------------ sort by user


@pytest.mark.parametrize("spans", [1, 2, 3, 5, 16])
def test_counting_sort_is_the_stable_argsort(spans):
    c = comparisons(spans)
    n_users = 60  # ids 50..59 have no comparisons
    counts, ordered = L.count_users(c[:, 0], n_users, spans)
    assert counts.shape == (spans, n_users) and not ordered
    totals = L.user_totals(counts)
    np.testing.assert_array_equal(totals, np.bincount(c[:, 0], minlength=n_users))
    user_ptr = np.r_[0, np.cumsum(totals)]
    out = np.empty((3, len(c)), np.int32)
    L.scatter_by_user(c[:, 0], c[:, 1], c[:, 2], counts, user_ptr, out[0], out[1], out[2])
    np.testing.assert_array_equal(out.T, c[np.argsort(c[:, 0], kind="stable")])
    _, ordered = L.count_users(out[0], n_users, spans)
    assert ordered


def test_count_users_ignores_ids_beyond_n_users():
    users = np.array([0, 2, 9, 1, 2, 12])
    counts, _ = L.count_users(users, 3, 2)
    np.testing.assert_array_equal(counts.sum(0), [1, 1, 2])


# ------------------------------------------------------------------------------ entries


@pytest.mark.parametrize("n_items, target", [(30, 64), (30, 4096), (3, 1), (10**6, 100)])
def test_entries_match_a_python_reference(n_items, target):
    c = comparisons(2, n_items=n_items, n=1500)
    c = c[np.argsort(c[:, 0], kind="stable")]
    n_users = 50
    user_ptr = np.r_[0, np.cumsum(np.bincount(c[:, 0], minlength=n_users))]
    blocks = S.user_blocks(user_ptr, target)
    cw, cl = c[:, 1].astype(np.int32), c[:, 2].astype(np.int32)
    pos_w, pos_l = np.empty(len(c), np.int32), np.empty(len(c), np.int32)
    n_entries = np.empty(n_users, np.int64)
    L.count_entries(blocks, user_ptr, cw, cl, n_items, pos_w, pos_l, n_entries)
    entry_ptr = np.r_[0, np.cumsum(n_entries)]
    entry_item = np.empty(entry_ptr[-1], np.int32)
    L.fill_entries(blocks, user_ptr, cw, cl, entry_ptr, pos_w, pos_l, entry_item)
    ref = entries_reference(c, n_users)
    for got, want in zip((entry_ptr, entry_item, pos_w, pos_l), ref):
        np.testing.assert_array_equal(got, want)


def test_user_blocks_and_parts_cover_the_users_in_order():
    c = comparisons(3)
    user_ptr = np.r_[0, np.cumsum(np.bincount(c[:, 0], minlength=55))]
    for target in (1, 10, 100, 10**6):
        b = S.user_blocks(user_ptr, target)
        assert b[0] == 0 and b[-1] == 55 and np.all(np.diff(b) >= 1)
        sizes = user_ptr[b[1:]] - user_ptr[b[:-1]]
        assert sizes.sum() == len(c)
        if target == 100:  # about the target, except for the heavy user's block
            assert np.median(sizes) < 3 * target
    for n in (1, 2, 7, 100):
        p = S.user_parts(user_ptr, n)
        assert p[0] == 0 and p[-1] == 55 and np.all(np.diff(p) >= 1) and len(p) - 1 <= n


@TWO_THREADS
def test_layout_is_the_same_on_any_thread_count():
    c = comparisons(4, n=5000)
    lays = []
    for n_threads in (1, 2):
        with numba_threads(n_threads):
            assert numba.get_num_threads() == n_threads
            lays.append(S.layout(c, 52, 31))
    for key, value in lays[0].items():
        assert np.array_equal(value, lays[1][key]), key


def test_threads_context_restores_the_count():
    before = numba.get_num_threads()
    with numba_threads(1):
        assert numba.get_num_threads() == 1
    assert numba.get_num_threads() == before


# ------------------------------------------------------------------------------ rebuilds


def test_scatter_duals_matches_bincount():
    c = comparisons(5)
    lay = S.layout(c, 50, 30)
    duals = np.random.default_rng(5).random(len(c))
    duals[::7] = 0.0
    out = np.full(lay["n_entries"], np.nan)
    K.scatter_duals(lay["blocks"], lay["user_ptr"], lay["pos_w"], lay["pos_l"],
                    lay["entry_ptr"], duals, out)
    ref = (np.bincount(lay["pos_w"], duals, lay["n_entries"])
           - np.bincount(lay["pos_l"], duals, lay["n_entries"]))
    np.testing.assert_allclose(out, ref, atol=1e-12)


@TWO_THREADS
@pytest.mark.parametrize("fit_bias", [False, True])
def test_v_rebuild_depends_on_the_parts_not_on_the_threads(fit_bias):
    c = comparisons(6, n=4000)
    lay = S.layout(c, 50, 30)
    rng = np.random.default_rng(6)
    U, beta = rng.normal(size=(50, 4)), rng.random(len(c))
    V_ref = np.zeros((30, 4))
    cs = lay["cols"].T
    np.add.at(V_ref, cs[:, 1], beta[:, None] * U[cs[:, 0]] / 2.0)
    np.add.at(V_ref, cs[:, 2], -beta[:, None] * U[cs[:, 0]] / 2.0)
    for n_parts in (1, 2, 5):
        runs = []
        for n_threads in (1, 2):
            V, b = np.full((30, 4), np.nan), np.zeros(30)
            parts = S.user_parts(lay["user_ptr"], n_parts)
            acc_V, acc_b = ((V[None], b[None]) if n_parts == 1 else
                            (np.empty((len(parts) - 1, 30, 4)), np.empty((len(parts) - 1, 30))))
            with numba_threads(n_threads):
                K.items_from_duals(parts, lay["user_ptr"], lay["pos_w"], lay["pos_l"],
                                   lay["entry_ptr"], lay["entry_item"], beta, U, 2.0, fit_bias,
                                   acc_V, acc_b, V, b)
            runs.append((V, b))
            np.testing.assert_allclose(V, V_ref, atol=1e-12)
        assert np.array_equal(runs[0][0], runs[1][0]) and np.array_equal(runs[0][1], runs[1][1])


def test_v_accumulators_stay_within_their_memory_bound():
    c = comparisons(7)
    lay = S.layout(c, 50, 30)
    V, b = np.zeros((30, 4)), np.zeros(30)
    parts, acc_V, _ = S.v_accumulators(lay, V, b)  # the same on any thread count
    assert 2 < len(parts) <= S.V_PARTS + 1 and not np.shares_memory(acc_V, V)
    big_V = np.zeros((10**7, 1))  # accumulators would need more than 64 MiB each
    parts, acc_V, _ = S.v_accumulators(lay, big_V, np.zeros(10**7))
    assert parts.tolist() == [0, 50] and np.shares_memory(acc_V, big_V)


@pytest.mark.parametrize("clip_to", [np.nan, 1.0])
def test_join_duals_is_the_same_for_any_split_of_the_users(clip_to):
    rng = np.random.default_rng(8)
    old = comparisons(8, n=2000)
    old = old[np.argsort(old[:, 0], kind="stable")]
    new = np.r_[old[rng.random(len(old)) < 0.9], comparisons(9, n=200)]
    lay = S.layout(new, 50, 30)
    a, b = rng.normal(size=len(old)) * 2, rng.random(len(old)) * 3
    old_ptr = np.r_[0, np.cumsum(np.bincount(old[:, 0], minlength=50))]
    outs = []
    for n_parts in (1, 3, 50):
        out_a, out_b = np.empty(len(new)), np.empty(len(new))
        matched = K.join_duals(S.user_parts(lay["user_ptr"], n_parts), old_ptr, old[:, 1].copy(),
                               old[:, 2].copy(), a, b, lay["user_ptr"], lay["pos_w"],
                               lay["pos_l"], lay["entry_ptr"], lay["entry_item"], 30, clip_to,
                               out_a, out_b)
        outs.append((out_a, out_b, matched))
    for out in outs[1:]:
        assert np.array_equal(out[0], outs[0][0]) and np.array_equal(out[1], outs[0][1])
        assert out[2] == outs[0][2]
    (ref_a, ref_b), matched = S.map_duals(old, (a, b), lay["cols"].T)
    if np.isnan(clip_to):
        np.testing.assert_array_equal(outs[0][0], ref_a)
    else:
        np.testing.assert_array_equal(outs[0][0], np.clip(ref_a, 0, clip_to))
        np.testing.assert_array_equal(outs[0][1], np.clip(ref_b, 0, clip_to))
    assert matched == outs[0][2]


@pytest.mark.parametrize("n_parts", [1, 3])
def test_entry_matrix_products_match_the_dense_matrix(n_parts):
    """reg_max's G (users x items, one value per entry) times vectors, both sides."""
    c = comparisons(10)
    lay = S.layout(c, 50, 30)
    rng = np.random.default_rng(10)
    data = rng.normal(size=lay["n_entries"])
    G = np.zeros((50, 30))
    G[np.repeat(np.arange(50), np.diff(lay["entry_ptr"])), lay["entry_item"]] = data
    x, y = rng.normal(size=30), rng.normal(size=50)
    y[::4] = 0.0
    out = np.empty(50)
    K.entries_matvec(lay["blocks"], lay["entry_ptr"], lay["entry_item"], data, x, out)
    np.testing.assert_allclose(out, G @ x, atol=1e-12)
    parts = S.user_parts(lay["entry_ptr"], n_parts)
    acc, out = np.empty((len(parts) - 1, 30)), np.empty(30)
    K.entries_rmatvec(parts, lay["entry_ptr"], lay["entry_item"], data, y, acc, out)
    np.testing.assert_allclose(out, G.T @ y, atol=1e-12)
