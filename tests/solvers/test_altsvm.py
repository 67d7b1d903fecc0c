"""Tests of solvers.AltSVM and its numba kernels, against slow numpy references."""

from __future__ import annotations

import json
import math
import warnings

import numba
import numpy as np
import pytest
import scipy.sparse as sp
from scipy.optimize import minimize_scalar

from solvers import AltSVM, ConvergenceWarning
from solvers import _altsvm_kernels as K
from solvers import _altsvm_solver as S
from solvers._ranking_metrics import ndcg_at_k
from solvers.pairs import pairs_from_ratings, split_ratings_per_user

LOSSES = ["squared_hinge", "hinge", "logistic"]
CODES = {"squared_hinge": K.SQUARED_HINGE, "hinge": K.HINGE, "logistic": K.LOGISTIC}


# ------------------------------------------------------------------------------ references


def ref_loss(loss, z):
    z = np.asarray(z, dtype=float)
    if loss == "squared_hinge":
        return np.maximum(0.0, 1.0 - z) ** 2
    if loss == "hinge":
        return np.maximum(0.0, 1.0 - z)
    return np.logaddexp(0.0, -z)


def ref_conj(loss, a):
    """L*(−a) written out from its definition sup_z (−a z − L(z))."""
    if loss == "squared_hinge":
        return -a + a * a / 4.0
    if loss == "hinge":
        return -a
    out = 0.0
    if a > 0:
        out += a * math.log(a)
    if a < 1:
        out += (1 - a) * math.log(1 - a)
    return out


def ref_slope(loss, z):
    """−L'(z): the optimal dual value of a comparison with margin z."""
    if loss == "squared_hinge":
        return 2.0 * np.maximum(0.0, 1.0 - z)
    if loss == "logistic":
        return 1.0 / (1.0 + np.exp(z))
    raise ValueError(loss)


def ref_objective(c, U, V, b, reg, loss):
    z = np.einsum("ij,ij->i", U[c[:, 0]], V[c[:, 1]] - V[c[:, 2]]) + b[c[:, 1]] - b[c[:, 2]]
    return ref_loss(loss, z).sum() + 0.5 * reg * ((U**2).sum() + (V**2).sum() + (b**2).sum())


def planted(n_users=40, n_items=60, rank=3, per_user=60, noise=0.5, seed=0, pair_seed=None):
    """Comparisons drawn from a planted low-rank score matrix with logistic noise.

    ``seed`` fixes the score matrix, ``pair_seed`` (default: ``seed``) the sampled pairs.
    """
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(n_users, rank)) @ rng.normal(size=(rank, n_items))
    X += rng.normal(size=n_items)  # a shared popularity component
    if pair_seed is not None:
        rng = np.random.default_rng(pair_seed)
    rows = []
    for i in range(n_users):
        j = rng.integers(0, n_items, per_user)
        k = rng.integers(0, n_items, per_user)
        keep = j != k
        j, k = j[keep], k[keep]
        p = 1.0 / (1.0 + np.exp(-(X[i, j] - X[i, k]) / noise))
        swap = rng.random(j.size) > p
        w = np.where(swap, k, j)
        lo = np.where(swap, j, k)
        rows.append(np.column_stack([np.full(j.size, i), w, lo]))
    return np.concatenate(rows)


def fit_quiet(c, warm_start=None, **kw):
    """Fit with test defaults (rank 3, reg 10, one thread, seed 0), ConvergenceWarning muted."""
    params = dict(rank=3, reg=10.0, n_threads=1, random_state=0)
    params.update(kw)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        return AltSVM(**params).fit(c, warm_start=warm_start)


# ------------------------------------------------------------------------------ coordinate step


@pytest.mark.parametrize("loss", LOSSES)
def test_dual_step_is_the_exact_1d_minimizer(loss):
    """eqs. (8)/(10): h(a') = (a' − a) g + q (a' − a)²/2 + L*(−a') minimized over the domain."""
    rng = np.random.default_rng(1)
    hi = {"squared_hinge": 50.0, "hinge": 1.0, "logistic": 1.0}[loss]
    cases = [(rng.uniform(0, min(hi, 3)), rng.normal(scale=2), rng.uniform(1e-3, 5))
             for _ in range(200)]
    cases += [(0.0, 0.3, 0.0), (0.5, -1.0, 0.0), (0.0, 5.0, 1e-3), (1.0, -5.0, 1e-3)]
    for a, g, q in cases:
        def h(x, a=a, g=g, q=q):
            return (x - a) * g + q * (x - a) ** 2 / 2 + ref_conj(loss, x)

        res = minimize_scalar(h, bounds=(0.0, hi), method="bounded",
                              options={"xatol": 1e-12, "maxiter": 2000})
        a_new = K.dual_step(CODES[loss], a, g, q)
        assert 0.0 <= a_new <= hi
        # no point found numerically (nor the ends of the domain) is better than the step
        assert h(a_new) <= min(res.fun, h(0.0), h(hi)) + 1e-9 * (1 + abs(res.fun))
        if q > 0:  # strictly convex in a': the minimizer is unique
            assert a_new == pytest.approx(res.x, abs=1e-5)


# ------------------------------------------------------------------------------ kernels vs numpy


def small_layout(seed=0, n_users=7, n_items=9, n=120):
    rng = np.random.default_rng(seed)
    u = rng.integers(0, n_users, n)
    w = rng.integers(0, n_items, n)
    lo = (w + rng.integers(1, n_items, n)) % n_items
    c = np.column_stack([u, w, lo])
    c = c[np.lexsort((c[:, 2], c[:, 1], c[:, 0]))]
    return c, S.layout(c, n_users, n_items), rng


def entry_users(lay):
    return np.repeat(np.arange(len(lay["entry_ptr"]) - 1), np.diff(lay["entry_ptr"]))


def test_build_entries_indexes_every_comparison_end():
    c, lay, _ = small_layout()
    eu, ei = entry_users(lay), lay["entry_item"]
    assert np.array_equal(eu[lay["pos_w"]], c[:, 0]) and np.array_equal(ei[lay["pos_w"]], c[:, 1])
    assert np.array_equal(eu[lay["pos_l"]], c[:, 0]) and np.array_equal(ei[lay["pos_l"]], c[:, 2])
    pairs = set(zip(c[:, 0], c[:, 1])) | set(zip(c[:, 0], c[:, 2]))
    assert len(pairs) == lay["n_entries"] == len(set(zip(eu, ei)))
    for i in range(len(lay["entry_ptr"]) - 1):
        assert (eu[lay["entry_ptr"][i]:lay["entry_ptr"][i + 1]] == i).all()


@pytest.mark.parametrize("fit_bias", [False, True])
def test_primal_rebuilds_and_shares_match_numpy(fit_bias):
    c, lay, rng = small_layout(1)
    n_users, n_items, r, reg = 7, 9, 4, 2.5
    U = rng.normal(size=(n_users, r))
    V = rng.normal(size=(n_items, r))
    b = rng.normal(size=n_items) if fit_bias else np.zeros(n_items)
    alpha, beta = rng.random(len(c)), rng.random(len(c))
    # V from beta (Alg. 1 line 3): V = (1/reg) Σ beta u_i (e_j − e_k)ᵀ
    V_ref = np.zeros_like(V)
    b_ref = np.zeros(n_items)
    np.add.at(V_ref, c[:, 1], beta[:, None] * U[c[:, 0]] / reg)
    np.add.at(V_ref, c[:, 2], -beta[:, None] * U[c[:, 0]] / reg)
    np.add.at(b_ref, c[:, 1], beta / reg)
    np.add.at(b_ref, c[:, 2], -beta / reg)
    for n_parts in (1, 3):  # one range adding into V, or several with accumulators
        V_k, b_k = np.full_like(V, np.nan), np.zeros(n_items)
        parts = S.user_parts(lay["user_ptr"], n_parts)
        acc_V, acc_b = ((V_k[None], b_k[None]) if n_parts == 1 else
                        (np.empty((len(parts) - 1, n_items, r)),
                         np.empty((len(parts) - 1, n_items))))
        K.items_from_duals(parts, lay["user_ptr"], lay["pos_w"], lay["pos_l"],
                           lay["entry_ptr"], lay["entry_item"], beta, U, reg, fit_bias, acc_V,
                           acc_b, V_k, b_k)
        np.testing.assert_allclose(V_k, V_ref, atol=1e-12)
        np.testing.assert_allclose(b_k, b_ref if fit_bias else 0.0, atol=1e-12)
    # U from alpha (Alg. 1 line 13)
    U_ref = np.zeros_like(U)
    np.add.at(U_ref, c[:, 0], alpha[:, None] * (V[c[:, 1]] - V[c[:, 2]]) / reg)
    U_k = np.full_like(U, np.nan)
    K.users_from_duals(lay["blocks"], lay["user_ptr"], lay["pos_w"], lay["pos_l"],
                       lay["entry_ptr"], lay["entry_item"], alpha, V, reg, U_k)
    np.testing.assert_allclose(U_k, U_ref, atol=1e-12)
    # each user's share of P, through the entries
    z = np.einsum("ij,ij->i", U[c[:, 0]], V[c[:, 1]] - V[c[:, 2]]) + b[c[:, 1]] - b[c[:, 2]]
    for loss in LOSSES:
        share_ref = np.bincount(c[:, 0], weights=ref_loss(loss, z), minlength=n_users)
        share_ref += 0.5 * reg * (U**2).sum(axis=1)
        share = np.empty(n_users)
        K.user_shares(lay["blocks"], lay["user_ptr"], lay["pos_w"], lay["pos_l"],
                      lay["entry_ptr"], lay["entry_item"], U, V, b, reg, CODES[loss], share)
        np.testing.assert_allclose(share, share_ref, rtol=1e-12)


def _replay_blocks(c_v, beta, U, V, b, fit_bias, reg, loss, block_ids, block_start):
    """Plain-Python dual CD steps over the given blocks, in the given order."""
    for q in block_ids:
        for ci in range(block_start[q], block_start[q + 1]):
            i, j, k = c_v[ci]
            x_u = np.r_[U[i], 1.0] if fit_bias else U[i]
            g = U[i] @ (V[j] - V[k]) + (b[j] - b[k] if fit_bias else 0.0)
            a_new = K.dual_step(loss, beta[ci], g, 2 * (x_u @ x_u) / reg)
            d = (a_new - beta[ci]) / reg
            beta[ci] = a_new
            V[j] += d * U[i]
            V[k] -= d * U[i]
            if fit_bias:
                b[j] += d
                b[k] -= d


@pytest.mark.parametrize("loss", LOSSES)
@pytest.mark.parametrize("fit_bias", [False, True])
def test_vstep_kernels_match_python_replay(loss, fit_bias):
    c, lay, rng = small_layout(2, n=300)
    r, reg = 3, 0.7
    U = rng.normal(size=(7, r))
    block_start = np.r_[np.arange(0, len(c), 16), len(c)]
    cu, cw, cl = (c[:, t].astype(np.int32) for t in range(3))
    ref = [np.zeros(len(c)), np.zeros((9, r)), np.zeros(9)]
    blocks_ref = np.arange(len(block_start) - 1)
    runs = {}
    for kernel in (K.vstep_serial, K.vstep_hogwild):
        state = [np.zeros(len(c)), np.zeros((9, r)), np.zeros(9)]
        blocks = np.arange(len(block_start) - 1)
        prev = numba.get_num_threads()
        numba.set_num_threads(1)  # one thread: the Hogwild kernel must equal the serial one
        try:
            for epoch in range(3):
                kernel(blocks, block_start, cu, cw, cl, state[0], U, state[1], state[2],
                       fit_bias, reg, CODES[loss], np.uint64(1000 + epoch))
        finally:
            numba.set_num_threads(prev)
        runs[kernel] = state
    for epoch in range(3):
        K._shuffle(blocks_ref, 0, len(blocks_ref), np.uint64(1000 + epoch))
        _replay_blocks(c, ref[0], U, ref[1], ref[2], fit_bias, reg, CODES[loss], blocks_ref,
                       block_start)
    for name, x, y in zip(("beta", "V", "b"), runs[K.vstep_serial], ref):
        np.testing.assert_allclose(x, y, atol=1e-10, err_msg=name)
    for x, y in zip(runs[K.vstep_serial], runs[K.vstep_hogwild]):
        assert np.array_equal(x, y)


@pytest.mark.parametrize("loss", LOSSES)
def test_ustep_kernels_match_python_replay(loss):
    """Fused U-step: old shares, rebuild from alpha, CD passes until the share is not above
    the old one (else the old u_i is kept)."""
    c, lay, rng = small_layout(3, n=200)
    r, reg, max_extra, seed = 3, 0.9, 3, np.uint64(77)
    V, b = rng.normal(size=(9, r)), rng.normal(size=9)
    U_old = rng.normal(scale=0.3, size=(7, r))
    alpha0 = rng.random(len(c)) * (1.0 if loss != "squared_hinge" else 2.0)
    out = {}
    for kernel in (K.ustep_serial, K.ustep_parallel):
        alpha, U, shares = alpha0.copy(), np.zeros((7, r)), np.empty((7, 2))
        kernel(S.user_blocks(lay["user_ptr"], 30), lay["user_ptr"], lay["cw"], lay["cl"],
               lay["pos_w"], lay["pos_l"], lay["entry_ptr"], lay["entry_item"], alpha, U_old, V,
               b, reg, CODES[loss], max_extra, seed, 0, U, shares)
        out[kernel] = (alpha, U, shares)
    for x, y in zip(out[K.ustep_serial], out[K.ustep_parallel]):
        assert np.array_equal(x, y)  # per-user streams: same numbers on any thread count

    def share(i, u):
        rows = c[:, 0] == i
        z = (V[c[rows, 1]] - V[c[rows, 2]]) @ u + b[c[rows, 1]] - b[c[rows, 2]]
        return ref_loss(loss, z).sum() + 0.5 * reg * u @ u

    alpha, (alpha_k, U_k, shares_k) = alpha0.copy(), out[K.ustep_serial]
    for i in range(7):
        lo, hi = lay["user_ptr"][i], lay["user_ptr"][i + 1]
        old = share(i, U_old[i])
        u = (alpha[lo:hi, None] * (V[c[lo:hi, 1]] - V[c[lo:hi, 2]])).sum(0) / reg
        state = np.uint64(K._stream_seed(seed, i))
        for _ in range(max_extra + 1):
            state, pos, stride = K._affine_order(hi - lo, np.uint64(state))
            for _ in range(hi - lo):
                ci = lo + pos
                pos = (pos + stride) % (hi - lo)
                d = V[c[ci, 1]] - V[c[ci, 2]]
                g = u @ d + b[c[ci, 1]] - b[c[ci, 2]]
                a_new = K.dual_step(CODES[loss], alpha[ci], g, d @ d / reg)
                u = u + (a_new - alpha[ci]) / reg * d
                alpha[ci] = a_new
            new = share(i, u)
            if new <= old:
                break
        else:
            u, new = U_old[i], old
        np.testing.assert_allclose(U_k[i], u, atol=1e-10)
        np.testing.assert_allclose(shares_k[i], [old, new], rtol=1e-10)
    np.testing.assert_allclose(alpha_k, alpha, atol=1e-10)


def test_affine_order_is_a_permutation():
    state = np.uint64(5)
    for m in (1, 2, 3, 7, 12, 100, 97 * 3):
        for _ in range(5):
            state, pos, stride = K._affine_order(m, state)
            seen = (pos + stride * np.arange(m)) % m
            assert np.array_equal(np.sort(seen), np.arange(m))


# ------------------------------------------------------------------------------ optimality


def model_with_items(loss, reg, seed=0, n_items=12, r=3):
    rng = np.random.default_rng(seed)
    m = AltSVM(rank=r, reg=reg, loss=loss, n_threads=1)
    m.item_factors_ = rng.normal(size=(n_items, r))
    m.item_bias_ = rng.normal(scale=0.5, size=n_items)
    m.user_factors_ = np.zeros((1, r))
    return m, rng


@pytest.mark.parametrize("loss", LOSSES)
def test_u_subproblem_meets_kkt_conditions(loss):
    """Problem (5) per user: u = (1/reg) Σ a_c (v_j − v_k) with a_c = −L'(z_c) (hinge: a_c ∈
    ∂, i.e. 1 if z_c < 1, 0 if z_c > 1, in [0, 1] otherwise)."""
    reg = 0.8
    m, rng = model_with_items(loss, reg)
    n_users, n = 5, 150
    users = rng.integers(0, n_users, n)
    w = rng.integers(0, 12, n)
    lo = (w + rng.integers(1, 12, n)) % 12
    U, alpha, gap = S.solve_users(np.column_stack([users, w, lo]), n_users, m.item_factors_,
                                   m.item_bias_, reg, loss, max_epochs=20000, gap_tol=1e-12)
    V, b = m.item_factors_, m.item_bias_
    D = V[w] - V[lo]
    # stationarity, recomputed from the duals in numpy
    U_ref = np.zeros_like(U)
    np.add.at(U_ref, users, alpha[:, None] * D / reg)
    np.testing.assert_allclose(U, U_ref, atol=1e-9)
    z = np.einsum("ij,ij->i", U[users], D) + b[w] - b[lo]
    if loss == "hinge":
        assert ((alpha >= 0) & (alpha <= 1)).all()
        assert np.all(alpha[z < 1 - 1e-5] > 1 - 1e-5)
        assert np.all(alpha[z > 1 + 1e-5] < 1e-5)
    else:
        np.testing.assert_allclose(alpha, ref_slope(loss, z), atol=1e-4)
    assert 0 <= gap < 1e-8


@pytest.mark.parametrize("loss", ["squared_hinge", "logistic"])
def test_vstep_converges_to_v_subproblem_optimum(loss):
    """Many V-step epochs with U fixed meet the KKT conditions of problem (6) (with bias)."""
    c, lay, rng = small_layout(4, n=150)
    r, reg = 3, 0.6
    U = rng.normal(size=(7, r))
    beta, V, b = np.zeros(len(c)), np.zeros((9, r)), np.zeros(9)
    bl, starts = np.arange(len(c)), np.arange(len(c) + 1)
    cu, cw, cl = (c[:, t].astype(np.int32) for t in range(3))
    for epoch in range(3000):
        K.vstep_serial(bl, starts, cu, cw, cl, beta, U, V, b, True, reg, CODES[loss],
                       np.uint64(epoch))
    z = np.einsum("ij,ij->i", U[c[:, 0]], V[c[:, 1]] - V[c[:, 2]]) + b[c[:, 1]] - b[c[:, 2]]
    np.testing.assert_allclose(beta, ref_slope(loss, z), atol=1e-6)
    V_ref = np.zeros_like(V)
    np.add.at(V_ref, c[:, 1], beta[:, None] * U[c[:, 0]] / reg)
    np.add.at(V_ref, c[:, 2], -beta[:, None] * U[c[:, 0]] / reg)
    np.testing.assert_allclose(V, V_ref, atol=1e-9)


@pytest.mark.parametrize("loss", LOSSES)
def test_fold_in_solves_the_single_user_problem(loss):
    m, rng = model_with_items(loss, 0.5, seed=3)
    pairs = np.column_stack([rng.integers(0, 12, 40), rng.integers(0, 12, 40)])
    pairs = pairs[pairs[:, 0] != pairs[:, 1]]
    u = m.fold_in(pairs)
    c = np.column_stack([np.zeros(len(pairs), dtype=np.int64), pairs])
    U, _, _ = S.solve_users(c, 1, m.item_factors_, m.item_bias_, 0.5, loss, max_epochs=20000,
                            gap_tol=1e-12)
    np.testing.assert_allclose(u, U[0], atol=1e-4)
    obj = lambda v: ref_loss(loss, (m.item_factors_[pairs[:, 0]] - m.item_factors_[pairs[:, 1]])  # noqa: E731
                             @ v + m.item_bias_[pairs[:, 0]] - m.item_bias_[pairs[:, 1]]).sum() \
        + 0.25 * (v @ v)
    for _ in range(20):  # no nearby point is better
        assert obj(u) <= obj(u + rng.normal(scale=1e-2, size=u.shape)) + 1e-9


# ------------------------------------------------------------------------------ the estimator


@pytest.mark.parametrize("loss", LOSSES)
@pytest.mark.parametrize("item_bias", [False, True])
@pytest.mark.parametrize("reg", [2.0, 10.0])
def test_objective_never_increases_and_is_the_primal(loss, item_bias, reg):
    """Single thread. reg = 2 is ill-conditioned for one epoch per half-step (the safeguards
    of the module docstring act there); reg = 10 is the ordinary regime."""
    c = planted(seed=5)
    m = fit_quiet(c, loss=loss, item_bias=item_bias, max_iter=25, tol=0.0, reg=reg)
    f = m.objective_
    assert len(f) == 25
    assert np.all(np.diff(f) <= 1e-12 * f[:-1])
    assert f[-1] < 0.98 * len(c) * ref_loss(loss, 0.0)  # well below U = V = 0
    ref = ref_objective(c, m.user_factors_, m.item_factors_, m.item_bias_, reg, loss)
    assert f[-1] == pytest.approx(ref, rel=1e-10)
    if not item_bias:
        assert np.all(m.item_bias_ == 0)


def test_learns_planted_preferences():
    c = planted(seed=6, per_user=120)
    test = planted(seed=6, per_user=40, pair_seed=106)  # same planted X, fresh pairs
    m = fit_quiet(c, rank=3, reg=10.0, item_bias=True, max_iter=50)
    acc = np.mean(m.predict(test[:, 0], test[:, 1]) > m.predict(test[:, 0], test[:, 2]))
    assert acc > 0.8


def test_single_thread_fits_are_bit_for_bit_reproducible():
    c = planted(seed=7)
    a = fit_quiet(c, item_bias=True, random_state=42, max_iter=8)
    b = fit_quiet(c, item_bias=True, random_state=42, max_iter=8)
    sa, sb = a.warm_state(), b.warm_state()
    for k in sa:
        assert np.array_equal(sa[k], sb[k]), k
    assert np.array_equal(a.objective_, b.objective_)
    d = fit_quiet(c, item_bias=True, random_state=43, max_iter=8)
    assert not np.array_equal(d.user_factors_, a.user_factors_)


@pytest.mark.skipif(numba.config.NUMBA_NUM_THREADS < 2, reason="needs 2 numba threads")
def test_parallel_fits_are_bit_for_bit_reproducible_by_default():
    """Same data, seed and thread count: the same factors, duals and iterations (the default
    V-step is stratified; the passes over users are race-free on any thread count; across
    thread counts: test_altsvm_parallel.py)."""
    c = planted(seed=11, n_users=80, per_user=150)
    a = fit_quiet(c, item_bias=True, random_state=5, max_iter=12, n_threads=2)
    b = fit_quiet(c, item_bias=True, random_state=5, max_iter=12, n_threads=2)
    sa, sb = a.warm_state(), b.warm_state()
    for k in sa:
        assert np.array_equal(sa[k], sb[k]), k
    assert np.array_equal(a.objective_, b.objective_) and a.n_iter_ == b.n_iter_


@pytest.mark.skipif(numba.config.NUMBA_NUM_THREADS < 2, reason="needs 2 numba threads")
def test_parallel_fit_reaches_the_same_quality():
    c = planted(seed=8, n_users=60, per_user=200)
    s = fit_quiet(c, item_bias=True, max_iter=30, tol=1e-6)
    for deterministic in (True, False):    # False: the Hogwild V-step
        p = fit_quiet(c, item_bias=True, max_iter=30, tol=1e-6, n_threads=2,
                      deterministic=deterministic)
        assert p.objective_[-1] == pytest.approx(s.objective_[-1], rel=2e-3)
        assert np.all(np.diff(p.objective_) <= 1e-12 * p.objective_[:-1])


def test_convergence_warning_says_what_to_change():
    with pytest.warns(ConvergenceWarning, match="max_iter=1"):
        AltSVM(rank=2, reg=1.0, max_iter=1, tol=0.0, n_threads=1).fit(planted(seed=9))


def test_global_ranking_is_rank_zero_with_bias():
    c = planted(seed=10)
    m = fit_quiet(c, rank=0, item_bias=True, tol=1e-8, max_iter=200)
    assert m.user_factors_.shape == (40, 0)
    # the global ranking's V-step is convex: its duals satisfy the KKT conditions
    st = m.warm_state()
    z = m.item_bias_[st["winner"]] - m.item_bias_[st["loser"]]
    np.testing.assert_allclose(st["beta"], ref_slope("squared_hinge", z), atol=2e-2)


# ------------------------------------------------------------------------------ warm start


def test_map_duals_joins_by_key_with_repeats():
    rng = np.random.default_rng(11)
    old = np.array([[0, 1, 2], [0, 1, 2], [3, 4, 5], [1, 2, 0], [9, 9, 1]])
    old_d = np.array([1.0, 2.0, 3.0, 4.0, 5.0])
    new = np.array([[3, 4, 5], [0, 1, 2], [7, 1, 2], [0, 1, 2], [0, 1, 2], [1, 0, 2]])
    (mapped, neg), matched = S.map_duals(old, (old_d, -old_d), new)
    # occurrences of a repeated key map in order; new and vanished keys are dropped
    np.testing.assert_array_equal(mapped, [3.0, 1.0, 0.0, 2.0, 0.0, 0.0])
    np.testing.assert_array_equal(neg, -mapped)
    assert matched == 3
    # against a dictionary join on random data with repeats, in any row order
    big = rng.integers(0, 6, size=(400, 3))
    d = rng.random(400)
    keep = rng.random(400) < 0.7
    target = np.r_[big[keep], rng.integers(0, 6, size=(50, 3))]
    target = target[rng.permutation(len(target))]
    (got, _), matched = S.map_duals(big, (d, d), target)
    pools = {}
    for row, val in zip(map(tuple, big.tolist()), d):
        pools.setdefault(row, []).append(val)
    want = [pools[row].pop(0) if pools.get(row) else 0.0 for row in map(tuple, target.tolist())]
    np.testing.assert_array_equal(got, want)
    assert matched == sum(1 for w in want if w != 0.0)


def test_map_duals_copies_unchanged_users_and_joins_changed_ones():
    """Retrain-like change: most users keep their comparisons in order (the join's fast
    path), some gain, lose or reorder comparisons; the result equals a dictionary join."""
    rng = np.random.default_rng(13)
    old = planted(seed=13, n_users=30, n_items=20, per_user=40)
    old = np.r_[old, old[:25]]  # repeated keys too
    old = old[np.argsort(old[:, 0], kind="stable")]
    d = rng.random(len(old)) + 0.1
    parts = []
    for i in range(30):
        rows = old[old[:, 0] == i]
        if i % 3 == 1:
            rows = np.r_[rows, [[i, 19, 18], [i, 0, 5]]]  # new comparisons appended
        elif i % 3 == 2:
            rows = rows[rng.permutation(len(rows))][: len(rows) - 3]  # reordered, some gone
        parts.append(rows)
    new = np.concatenate(parts)
    (got, neg), matched = S.map_duals(old, (d, -d), new)
    pools = {}
    for row, val in zip(map(tuple, old.tolist()), d):
        pools.setdefault(row, []).append(val)
    want = [pools[row].pop(0) if pools.get(row) else 0.0 for row in map(tuple, new.tolist())]
    np.testing.assert_array_equal(got, want)
    np.testing.assert_array_equal(neg, -got)
    assert matched == sum(1 for w in want if w != 0.0)


def test_warm_start_on_unchanged_data_stops_within_two_iterations():
    # tol 1e-4 of the rule "decrease <= tol (P(0) - P)" (a cold fit takes ~20 iterations);
    # at 1e-5 the per-iteration decrease here is at the noise level of the coordinate order
    # (it goes 0.125, 0.049, 0.058, 0.059, 0.042 near the end), so where a cold fit stops
    # and how long a continuation runs are a matter of luck
    c = planted(seed=12, n_users=60, per_user=150)
    cold = fit_quiet(c, rank=4, reg=10.0, item_bias=True, max_iter=100, tol=1e-4)
    assert cold.converged_ and cold.n_iter_ > 10
    state = json.loads(json.dumps({k: v.tolist() for k, v in cold.warm_state().items()}))
    rows = np.random.default_rng(0).permutation(len(c))  # row order must not matter
    warm = fit_quiet(c[rows], rank=4, reg=10.0, item_bias=True, max_iter=100, tol=1e-4,
                     warm_start=state)
    assert warm.n_warm_matched_ == len(c)
    assert warm.converged_ and warm.n_iter_ <= 2
    assert warm.objective_[-1] <= cold.objective_[-1] * (1 + 1e-5)
    same_order = fit_quiet(c, rank=4, reg=10.0, item_bias=True, max_iter=100, tol=1e-4,
                           warm_start=state)  # every user on the join's fast path
    assert same_order.n_warm_matched_ == len(c)
    assert same_order.converged_ and same_order.n_iter_ <= 2


def first_iteration_reaching(model, target):
    hit = np.flatnonzero(model.objective_ <= target)
    return int(hit[0]) + 1 if hit.size else None


def test_warm_start_after_five_percent_new_comparisons():
    """The warm fit reaches the cold fit's final objective (within tol) in at most half of the
    cold fit's iterations. New users and a new item must be grown."""
    full = planted(seed=14, n_users=80, n_items=100, per_user=200)
    rng = np.random.default_rng(1)
    new = rng.random(len(full)) < 0.05
    new |= (full[:, 0] >= 78) | (full[:, 1] == 99) | (full[:, 2] == 99)
    kw = dict(rank=4, reg=30.0, item_bias=True, max_iter=200, tol=1e-5)
    base = fit_quiet(full[~new], **kw)
    assert base.user_factors_.shape[0] < 80 and base.item_factors_.shape[0] < 100
    cold = fit_quiet(full, **kw)
    warm = fit_quiet(full, warm_start=base.warm_state(), **kw)
    assert warm.user_factors_.shape == (80, 4) and warm.item_factors_.shape == (100, 4)
    assert cold.converged_ and warm.converged_
    reached = first_iteration_reaching(warm, cold.objective_[-1] * (1 + kw["tol"]))
    assert reached is not None and reached <= cold.n_iter_ / 2


def test_warm_start_rebuilds_the_primal_from_the_duals():
    c = planted(seed=14)
    m = fit_quiet(c, item_bias=True, max_iter=10)
    st = m.warm_state()
    st["U"] = np.full_like(st["U"], 123.0)  # ignored: U is rebuilt from alpha and V
    w = fit_quiet(c, item_bias=True, max_iter=1, tol=0.0, warm_start=st)
    assert w.objective_init_ == pytest.approx(m.objective_[-1], rel=1e-9)


def test_warm_start_rejects_mismatched_state():
    c = planted(seed=15)
    m = fit_quiet(c, max_iter=3)
    st = m.warm_state()
    with pytest.raises(ValueError, match="rank 3, this model has rank=5"):
        fit_quiet(c, rank=5, warm_start=st)
    with pytest.raises(ValueError, match="lacks"):
        fit_quiet(c, warm_start={k: v for k, v in st.items() if k != "beta"})
    bad = dict(st, alpha=st["alpha"].copy())
    bad["alpha"][4] = np.nan
    with pytest.raises(ValueError, match=r"warm_start\['alpha'\] contains .*nan.* at position 4"):
        fit_quiet(c, warm_start=bad)


# ------------------------------------------------------------------------------ bad input


@pytest.mark.parametrize("comparisons, n_users, n_items, match", [
    ([[0, 1, 2], [1, -3, 2]], None, None, r"contains -3 at position \(1, 1\)"),
    ([[0, 1, 2], [1, 2, 2]], None, None, r"comparisons\[1\] has winner == loser == 2"),
    (np.empty((0, 3), dtype=int), None, None, "empty"),
    ([[0.0, 1.0, 2.0], [1.0, np.nan, 2.0]], None, None, r"nan\)? at position \(1, 1\)"),
    ([[0, 1.5, 2]], None, None, r"1.5 at position \(0, 1\)"),
    ([[0, 1, 2], [5, 0, 1]], 5, None, r"comparisons\[1, 0\] is user 5, but n_users=5"),
    ([[0, 1, 2], [1, 0, 7]], None, 7, r"comparisons\[1, 2\] is item 7, but n_items=7"),
    ([[0, 1]], None, None, r"shape \(1, 2\), expected \(n, 3\)"),
])
def test_bad_comparisons_are_named(comparisons, n_users, n_items, match):
    with pytest.raises(ValueError, match=match):
        AltSVM(n_threads=1).fit(comparisons, n_users=n_users, n_items=n_items)


@pytest.mark.parametrize("params, match", [
    (dict(rank=-1), "rank is -1"),
    (dict(rank=0), "rank is 0 and item_bias is False"),
    (dict(reg=0.0), "reg is 0.0"),
    (dict(reg=np.nan), "reg is nan"),
    (dict(loss="l1"), "loss is 'l1'"),
    (dict(max_iter=0), "max_iter is 0"),
    (dict(tol=-1.0), "tol is -1.0"),
    (dict(n_threads=0), "n_threads is 0"),
    (dict(n_threads=10**6), "n_threads is 1000000, but numba has"),
])
def test_bad_parameters_are_named(params, match):
    with pytest.raises(ValueError, match=match):
        AltSVM(**params).fit([[0, 1, 2]])


def test_constructor_is_keyword_only_and_stores_parameters():
    with pytest.raises(TypeError):
        AltSVM(10)  # noqa
    m = AltSVM(rank=7, reg=3.0, loss="hinge", item_bias=True, max_iter=4, tol=1e-3, n_threads=1,
               random_state=5, verbose=False)
    assert m.get_params() == dict(rank=7, reg=3.0, reg_ratio=0.3, loss="hinge", item_bias=True,
                                  max_iter=4, tol=1e-3, n_threads=1, deterministic=True,
                                  random_state=5, verbose=False, ray_address=None,
                                  ray_workers=None)


# ------------------------------------------------------------------------------ using the model


def test_recommend_matches_brute_force_and_excludes_seen_items():
    c = planted(seed=16)
    m = fit_quiet(c, item_bias=True, max_iter=5)
    X = m.user_factors_ @ m.item_factors_.T + m.item_bias_
    seen = sp.csr_matrix((np.ones(len(c)), (c[:, 0], c[:, 1])), shape=X.shape)
    users = np.array([3, 0, 17, 3])
    items, scores = m.recommend(users, k=5, exclude=seen)
    lists = [seen[u].indices for u in users]
    items2, scores2 = m.recommend(users, k=5, exclude=lists)
    np.testing.assert_array_equal(items, items2)
    for row, u in enumerate(users):
        s = X[u].copy()
        s[seen[u].indices] = -np.inf
        ref = np.argsort(-s, kind="stable")[:5]
        np.testing.assert_allclose(scores[row], s[ref], rtol=1e-6)  # float32 scores
        assert not np.isin(items[row], seen[u].indices).any()
    one, one_s = m.recommend(17, k=5, exclude=seen)
    np.testing.assert_array_equal(one, items[2])
    # more than the remaining items: padded with -1 / -inf
    all_but_two = [np.arange(2, 60)]
    it, sc = m.recommend([0], k=4, exclude=all_but_two)
    assert sorted(it[0, :2]) == [0, 1] and (it[0, 2:] == -1).all() and np.isinf(sc[0, 2:]).all()
    with pytest.raises(ValueError, match=r"users\[1\] is 40, but the model has 40 users"):
        m.recommend([0, 40])


def test_recommend_gives_the_lists_the_publisher_stores():
    """One top-K: AltSVM.recommend and the publisher's per-user lists (solvers.topk on the
    float32 factors of the artifact) agree item for item, ties included."""
    from solvers.topk import user_topk_blocks

    c = planted(seed=19)
    m = fit_quiet(c, item_bias=True, max_iter=3)
    m.item_factors_[[4, 9]] = m.item_factors_[7]  # three items tie for every user
    m.item_bias_[[4, 9]] = m.item_bias_[7]
    items, scores = m.recommend(np.arange(40), k=12)
    U32, V32 = m.user_factors_.astype(np.float32), m.item_factors_.astype(np.float32)
    published = np.concatenate([b.indices for b in user_topk_blocks(
        U32, V32, 12, item_bias=m.item_bias_.astype(np.float32))])
    np.testing.assert_array_equal(items, published)


def test_predict_is_the_score_matrix():
    c = planted(seed=17)
    m = fit_quiet(c, item_bias=True, max_iter=3)
    X = m.user_factors_ @ m.item_factors_.T + m.item_bias_
    np.testing.assert_allclose(m.predict([1, 2, 3], [4, 5, 6]), X[[1, 2, 3], [4, 5, 6]])


def test_save_load_roundtrip(tmp_path):
    c = planted(seed=18)
    m = fit_quiet(c, item_bias=True, max_iter=4, random_state=3)
    m.save(tmp_path / "model")
    with np.load(tmp_path / "model" / "arrays.npz", allow_pickle=False) as z:
        assert set(z.files) >= {"U", "V", "b", "alpha", "beta", "user", "winner", "loser"}
    manifest = json.loads((tmp_path / "model" / "manifest.json").read_text())
    assert manifest["algorithm"] == "AltSVM" and manifest["params"]["rank"] == 3
    m2 = AltSVM.load(tmp_path / "model")
    assert m2.get_params() == m.get_params()
    for k, v in m.warm_state().items():
        assert np.array_equal(m2.warm_state()[k], v)
    assert m2.n_iter_ == m.n_iter_ and np.array_equal(m2.objective_, m.objective_)
    np.testing.assert_array_equal(m2.recommend([0, 1], k=3)[0], m.recommend([0, 1], k=3)[0])
    w = fit_quiet(c, item_bias=True, max_iter=4, random_state=3, warm_start=m2.warm_state())
    assert w.objective_[-1] <= m.objective_[-1] * (1 + 1e-9)


# ------------------------------------------------------------------------------ MovieLens 100K


def test_movielens_100k_paper_protocol(shared_data):
    """Park et al. §5.2, N = 50: rank 10, reg 1000 reaches NDCG@10 >= 0.69 (C++ code: 0.692)."""
    path = shared_data / "movielens-100k" / "u.data"
    if not path.exists():
        pytest.skip(f"{path} not found")
    d = np.loadtxt(path, dtype=np.int64)
    users, items, ratings = d[:, 0] - 1, d[:, 1] - 1, d[:, 2].astype(float)
    train, test = split_ratings_per_user(users, 50, 10, random_state=0)
    c = pairs_from_ratings(users[train], items[train], ratings[train])
    assert 400_000 < len(c) < 450_000
    m = AltSVM(rank=10, reg=1000.0, random_state=0).fit(c, n_users=943, n_items=1682)
    score = ndcg_at_k(users[test], ratings[test], m.predict(users[test], items[test]), k=10)
    assert score >= 0.69
    # warm start after 5% more comparisons (paper settings): the cold fit's objective within
    # tol in at most half its iterations; unchanged data stops within 2 iterations
    new = np.random.default_rng(1).random(len(c)) < 0.05
    kw = dict(rank=10, reg=1000.0, random_state=0, n_threads=1)
    base = AltSVM(**kw).fit(c[~new], n_users=943, n_items=1682)
    cold = AltSVM(**kw).fit(c, n_users=943, n_items=1682)
    warm = AltSVM(**kw).fit(c, n_users=943, n_items=1682, warm_start=base.warm_state())
    reached = first_iteration_reaching(warm, cold.objective_[-1] * (1 + cold.tol))
    assert reached is not None and reached <= cold.n_iter_ / 2
    again = AltSVM(**kw).fit(c, n_users=943, n_items=1682, warm_start=cold.warm_state())
    assert again.n_iter_ <= 2
