"""KernelRankSVM: every fast kernel against a slow reference, optimality by the KKT condition
of (3.13) and by the duality gap of the pairwise dual, the blocked Q against the full Q, warm
start, Nyström, the errors, the per-query metrics, and one real MQ2008 fold."""

from __future__ import annotations

import gzip
import warnings

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy.optimize import minimize
from scipy.stats import spearmanr

from solvers import ConvergenceWarning
from solvers import _ranksvm_kernels as _k
from solvers._base import NotFittedError
from solvers._gram import GramMatrix, KernelSpace, KernelSpec, kernel_block, row_norms
from solvers._query_metrics import (
    query_average_precision,
    query_ndcg,
    query_pairwise_accuracy,
)
from solvers._ranksvm_frank_wolfe import frank_wolfe
from solvers._ranksvm_tron import PairLoss, tron
from solvers.kernel_ranksvm import KernelRankSVM, _pair_layout

# --------------------------------------------------------------------------------------------
# slow references
# --------------------------------------------------------------------------------------------


def _layout(rng, n_queries=12, max_docs=10, max_levels=4):
    """A random (qptr, level) layout with ties in level and one-level queries."""
    sizes = rng.integers(1, max_docs + 1, n_queries)
    qptr = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)
    level = np.empty(qptr[-1], dtype=np.int64)
    for q in range(n_queries):
        a, b = qptr[q], qptr[q + 1]
        raw = rng.integers(0, rng.integers(1, max_levels + 1), b - a)
        level[a:b] = np.unique(raw, return_inverse=True)[1].ravel()
    return qptr, level


def _pairs(qptr, level):
    """P as an explicit (p, 2) array: (i, j) with level_i > level_j in one query."""
    out = []
    for q in range(qptr.size - 1):
        for i in range(qptr[q], qptr[q + 1]):
            for j in range(qptr[q], qptr[q + 1]):
                if level[i] > level[j]:
                    out.append((i, j))
    return np.array(out, dtype=np.int64).reshape(-1, 2)


def _brute_sums(f, P, tau_lo, tau_hi, U):
    n, m = U.shape
    cnt_lo, cnt_hi = np.zeros(n), np.zeros(n)
    sum_lo, sum_hi = np.zeros((n, m)), np.zeros((n, m))
    for i, j in P:
        inside = f[j] > f[i] - 1.0 + tau_lo and not f[j] > f[i] - 1.0 + tau_hi
        if inside:
            cnt_lo[i] += 1
            sum_lo[i] += U[j]
            cnt_hi[j] += 1
            sum_hi[j] += U[i]
    return cnt_lo, sum_lo, cnt_hi, sum_hi


def _loss_ref(f, P, mu):
    z = 1.0 - f[P[:, 0]] + f[P[:, 1]]
    if mu is None:
        return float(np.sum(np.maximum(z, 0.0) ** 2))
    return float(np.sum(np.where(z <= 0, 0.0, np.where(z <= mu, z * z / (2 * mu),
                                                         z - mu / 2))))


def _rbf(X, gamma):
    d = ((X[:, None, :] - X[None, :, :]) ** 2).sum(-1)
    return np.exp(-gamma * d)


def _ranking_data(seed=0, n_queries=15, docs=12, n_features=5):
    rng = np.random.default_rng(seed)
    n = n_queries * docs
    X = rng.normal(size=(n, n_features))
    query = np.repeat(np.arange(n_queries), docs)
    score = X[:, 0] - 0.5 * X[:, 1] ** 2 + 0.3 * rng.normal(size=n)
    y = np.digitize(score, [-0.5, 0.8]).astype(float)
    return X, y, query


# --------------------------------------------------------------------------------------------
# pair sums
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("band", [(0.0, np.inf), (0.0, 0.5), (0.5, np.inf), (-1.0, 1.0)])
def test_pair_sums_match_brute_force_with_ties(seed, band):
    rng = np.random.default_rng(seed)
    qptr, level = _layout(rng)
    n = qptr[-1]
    f = rng.integers(-4, 5, n) * 0.5  # many ties, and margins exactly on the band edges
    U = rng.normal(size=(n, 2))
    order = np.empty(n, dtype=np.int64)
    _k.argsort_segments(f, qptr, order)
    for q in range(qptr.size - 1):
        seg = order[qptr[q]:qptr[q + 1]]
        assert np.all(np.diff(f[seg]) >= 0) and set(seg) == set(range(qptr[q], qptr[q + 1]))
    got = [np.empty(n), np.empty((n, 2)), np.empty(n), np.empty((n, 2))]
    _k.pair_sums(f, order, qptr, level, band[0], band[1], U, *got)
    want = _brute_sums(f, _pairs(qptr, level), band[0], band[1], U)
    for a, b in zip(got, want):
        np.testing.assert_allclose(a, b, atol=1e-12)
    par = [np.empty(n), np.empty((n, 2)), np.empty(n), np.empty((n, 2))]
    _k.pair_sums_parallel(f, order, qptr, level, band[0], band[1], U, *par, 3)
    for a, b in zip(par, got):
        np.testing.assert_array_equal(a, b)


@settings(max_examples=40, deadline=None)
@given(st.integers(0, 2**31 - 1), st.integers(1, 6), st.floats(0.05, 2.0))
def test_pair_sums_property(seed, max_levels, mu):
    rng = np.random.default_rng(seed)
    qptr, level = _layout(rng, n_queries=5, max_levels=max_levels)
    n = qptr[-1]
    f = np.round(rng.normal(size=n), 1)
    U = rng.normal(size=(n, 1))
    order = np.empty(n, dtype=np.int64)
    _k.argsort_segments(f, qptr, order)
    got = [np.empty(n), np.empty((n, 1)), np.empty(n), np.empty((n, 1))]
    _k.pair_sums(f, order, qptr, level, 0.0, mu, U, *got)
    want = _brute_sums(f, _pairs(qptr, level), 0.0, mu, U)
    for a, b in zip(got, want):
        np.testing.assert_allclose(a, b, atol=1e-12)
    # each pair is counted from both of its ends
    assert got[0].sum() == got[2].sum()


def test_pair_counts_total():
    qptr, level = _layout(np.random.default_rng(3))
    assert _k.pair_counts_total(qptr, level).sum() == len(_pairs(qptr, level))


# --------------------------------------------------------------------------------------------
# loss, gradient, Hessian-vector products
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("mu", [None, 0.3])
def test_pair_loss_value_gradient_hessian(mu):
    rng = np.random.default_rng(1)
    qptr, level = _layout(rng, n_queries=15)
    P = _pairs(qptr, level)
    n = qptr[-1]
    loss = PairLoss(qptr, level, mu)
    f = rng.normal(size=n)
    value, grad, state = loss.evaluate(f)
    assert value == pytest.approx(_loss_ref(f, P, mu), rel=1e-12)
    eps = 1e-6
    fd = np.array([(_loss_ref(f + eps * e, P, mu) - _loss_ref(f - eps * e, P, mu)) / (2 * eps)
                   for e in np.eye(n)])
    np.testing.assert_allclose(grad, fd, atol=1e-6)
    z = 1.0 - f[P[:, 0]] + f[P[:, 1]]
    dsum = np.sum(2 * np.maximum(z, 0) if mu is None else np.clip(z / mu, 0, 1))
    assert state["dsum"] == pytest.approx(dsum, rel=1e-12)
    u = rng.normal(size=n)
    Hu = loss.hess_apply(state, f, u)
    g_plus = loss.evaluate(f + eps * u)[1]
    g_minus = loss.evaluate(f - eps * u)[1]
    np.testing.assert_allclose(Hu, (g_plus - g_minus) / (2 * eps), atol=1e-5)
    # explicit generalized Hessian W A_Bᵀ A_B
    band = (z > 0) if mu is None else (z > 0) & (z <= mu)
    A = np.zeros((len(P), n))
    A[np.arange(len(P)), P[:, 0]] = 1.0
    A[np.arange(len(P)), P[:, 1]] = -1.0
    W = 2.0 if mu is None else 1.0 / mu
    np.testing.assert_allclose(Hu, W * A[band].T @ (A[band] @ u), atol=1e-10)


@pytest.mark.parametrize("mu", [None, 0.5])
def test_objective_gradient_and_hessian_in_beta_against_finite_differences(mu):
    """∇F(β) = Q(β + C ∇L(Qβ)) and the generalized Hessian (B.3) Q + C Q A_Bᵀ W A_B Q."""
    rng = np.random.default_rng(2)
    qptr, level = _layout(rng, n_queries=8)
    n = qptr[-1]
    P = _pairs(qptr, level)
    X = rng.normal(size=(n, 3))
    Q = _rbf(X, 0.5)
    C = 0.7
    loss = PairLoss(qptr, level, mu)

    def F(beta):
        return 0.5 * beta @ Q @ beta + C * _loss_ref(Q @ beta, P, mu)

    def grad(beta):
        return Q @ (beta + C * loss.evaluate(Q @ beta)[1])

    beta = rng.normal(size=n)
    eps = 1e-6
    fd = np.array([(F(beta + eps * e) - F(beta - eps * e)) / (2 * eps) for e in np.eye(n)])
    np.testing.assert_allclose(grad(beta), fd, rtol=1e-5, atol=1e-5)
    v = rng.normal(size=n)
    _, _, state = loss.evaluate(Q @ beta)
    Hv = Q @ v + Q @ (C * loss.hess_apply(state, Q @ beta, Q @ v))
    fd_h = (grad(beta + eps * v) - grad(beta - eps * v)) / (2 * eps)
    np.testing.assert_allclose(Hv, fd_h, rtol=1e-4, atol=1e-4)


# --------------------------------------------------------------------------------------------
# Gram matrix: blocks, cache, factored linear kernel
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("kernel", ["rbf", "poly", "linear"])
def test_kernel_block_matches_direct_formula(kernel):
    rng = np.random.default_rng(4)
    A, B = rng.random((37, 6)), rng.random((23, 6))
    spec = KernelSpec(kernel, 0.3, 3, 1.0)
    want = {"rbf": np.exp(-0.3 * ((A[:, None] - B[None]) ** 2).sum(-1)),
            "poly": (0.3 * A @ B.T + 1.0) ** 3, "linear": A @ B.T}[kernel]
    got64 = kernel_block(A, B, row_norms(A), row_norms(B), spec)
    np.testing.assert_allclose(got64, want, rtol=1e-12, atol=1e-12)
    A32, B32 = A.astype(np.float32), B.astype(np.float32)
    got32 = kernel_block(A32, B32, row_norms(A32), row_norms(B32), spec)
    assert got32.dtype == np.float32
    np.testing.assert_allclose(got32, want, rtol=2e-6, atol=1e-6)


@pytest.mark.parametrize("shift", [0.0, 10.0], ids=["factored", "direct"])
def test_kernel_dot_matches_the_direct_formula(shift):
    """Near the origin the factored form; shifted by 10 (γ(‖x‖² + ‖s‖²) ≈ 900, where
    exp(2γxᵀs) would overflow) the direct one, with kernel values of order 1 in both."""
    from solvers._gram import kernel_dot

    rng = np.random.default_rng(24)
    X, S = rng.random((40, 6)) + shift, rng.random((70, 6)) + shift
    coef = rng.normal(size=70)
    gamma = 0.7
    want = np.exp(-gamma * ((X[:, None, :] - S[None]) ** 2).sum(-1)) @ coef
    assert np.abs(want).max() > 1.0
    got = kernel_dot(X, S, coef, KernelSpec("rbf", gamma, 3, 1.0))
    np.testing.assert_allclose(got, want, rtol=1e-9, atol=1e-9)


@pytest.mark.parametrize("cache_rows", [0, 1, 57, 130, 200])
def test_blocked_gram_products_equal_the_full_matrix(cache_rows, monkeypatch):
    rng = np.random.default_rng(5)
    X = rng.random((200, 7))
    spec = KernelSpec("rbf", 0.4, 3, 1.0)
    monkeypatch.setattr("solvers._gram._BLOCK_BYTES", 24 * 200 * 4)  # 24-row blocks
    monkeypatch.setattr("solvers._gram._MIN_BLOCK_ROWS", 1)
    cache = cache_rows * (cache_rows + 1) * 2
    G = GramMatrix(X, spec, cache_bytes=cache)
    assert G.n_cached == cache_rows
    Q = _rbf(X, 0.4)
    v = rng.normal(size=200)
    np.testing.assert_allclose(G.matvec(v), Q @ v, rtol=1e-5, atol=1e-4)
    full = GramMatrix(X, spec, cache_bytes=1e9)
    np.testing.assert_allclose(G.matvec(v), full.matvec(v), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("cache", [1e9, 200 * 201 * 2], ids=["block stored", "no room"])
def test_grown_gram_reuses_kept_rows_and_equals_a_fresh_matrix(cache, monkeypatch):
    monkeypatch.setattr("solvers._gram._MIN_BLOCK_ROWS", 1)
    rng = np.random.default_rng(11)
    spec = KernelSpec("rbf", 0.4, 3, 1.0)
    X0, ids0 = rng.random((200, 7)), np.arange(200)
    G0 = GramMatrix(X0, spec, cache_bytes=cache, ids=ids0)
    # the next data set: 4 rows gone, 3 with changed features, 12 new ids, shuffled
    X1, ids1 = X0[4:].copy(), ids0[4:].copy()
    X1[:3] += 0.5
    X1 = np.vstack([X1, rng.random((12, 7))])
    ids1 = np.concatenate([ids1, 1000 + np.arange(12)])
    perm = rng.permutation(len(ids1))
    X1, ids1 = X1[perm], ids1[perm]
    G1 = G0.grown(X1, ids1, cache_bytes=cache)
    assert G1 is not None and G1.n_reused == 196 - 3 and G1.n == 208
    assert (G1.n_cached == 200 + 15) == (cache == 1e9)  # the appended block stored or not
    v = rng.normal(size=208)
    np.testing.assert_allclose(G1.matvec(v), _rbf(X1, 0.4) @ v, rtol=1e-5, atol=1e-4)
    # grown twice: the second block goes on top of the first
    X2, ids2 = np.vstack([X1, rng.random((5, 7))]), np.concatenate([ids1, [2000, 2001, 2002,
                                                                          2003, 2004]])
    G2 = G1.grown(X2, ids2, cache_bytes=cache)
    assert G2.n_reused == 208 and G2.n_grown == 2
    v = rng.normal(size=213)
    np.testing.assert_allclose(G2.matvec(v), _rbf(X2, 0.4) @ v, rtol=1e-5, atol=1e-4)


@pytest.mark.parametrize("n_threads", [1, 2, 3])
def test_packed_products_of_several_vectors_on_several_threads(n_threads):
    import numba

    rng = np.random.default_rng(21)
    X = rng.random((157, 6))
    G = GramMatrix(X, KernelSpec("rbf", 0.3, 3, 1.0), cache_bytes=1e9)
    Q = _rbf(X, 0.3)
    V = rng.normal(size=(3, 157))
    previous = numba.get_num_threads()
    numba.set_num_threads(min(n_threads, numba.config.NUMBA_NUM_THREADS))
    try:
        cuts = _k.packed_row_cuts(157, n_threads)
        assert cuts[0] == 0 and cuts[-1] == 157 and np.all(np.diff(cuts) > 0)
        np.testing.assert_allclose(G.matvec(V), V @ Q, rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(G.matvec(V[1]), Q @ V[1], rtol=1e-5, atol=1e-5)
    finally:
        numba.set_num_threads(previous)


def test_product_from_known_equals_a_full_product(monkeypatch):
    monkeypatch.setattr("solvers._gram._MIN_BLOCK_ROWS", 1)
    rng = np.random.default_rng(22)
    spec = KernelSpec("rbf", 0.4, 3, 1.0)
    X0, ids0 = rng.random((300, 5)), np.arange(300)
    G0 = GramMatrix(X0, spec, cache_bytes=1e9, ids=ids0)
    assert G0.product_from_known(np.ones(300)) is None      # nothing remembered
    u = rng.normal(size=300)
    G0.remember(u, G0.matvec(u))
    np.testing.assert_allclose(G0.product_from_known(u), G0.matvec(u), rtol=1e-12)
    # 2 rows gone (one with a coefficient), 6 new rows, shuffled
    X1 = np.vstack([X0[2:], rng.random((6, 5))])
    ids1 = np.concatenate([ids0[2:], 1000 + np.arange(6)])
    perm = rng.permutation(len(ids1))
    X1, ids1 = X1[perm], ids1[perm]
    G1 = G0.grown(X1, ids1, cache_bytes=1e9)
    Q1 = _rbf(X1, 0.4)
    v = np.zeros(len(ids1))
    kept = ids1 < 1000
    v[kept] = u[ids1[kept]]                                  # the warm start: new rows at 0
    np.testing.assert_allclose(G1.product_from_known(v), Q1 @ v, rtol=1e-5, atol=1e-4)
    v[~kept] = rng.normal(size=6)                            # new rows' coefficients
    v[np.flatnonzero(kept)[:3]] += 1.0                       # and 3 changed ones
    np.testing.assert_allclose(G1.product_from_known(v), Q1 @ v, rtol=1e-5, atol=1e-4)
    assert G1.product_from_known(rng.normal(size=len(ids1))) is None  # all changed: no gain


def test_gradient_norm_from_the_cg_residual_equals_the_exact_norm():
    from solvers._ranksvm_tron import _gradient_norm_from_residual, _trcg

    X, y, query = _ranking_data(seed=23, n_queries=20)
    rows, qptr, level, _, _ = _pair_layout(y, query)
    spec = KernelSpec("rbf", 0.5, 3, 1.0)
    space = KernelSpace(GramMatrix(X[rows], spec, cache_bytes=1e9))
    C = 0.7
    for mu in (None, 0.1):
        loss = PairLoss(qptr, level, mu)
        beta = np.random.default_rng(1).normal(size=space.dim) * 0.01
        f = space.riesz(beta)
        _, dL, state = loss.evaluate(f)
        rho = beta + C * dL
        s, Rs, Fs, r, Rr, _, _ = _trcg(space, loss, state, f, C, rho, space.riesz(rho), 10.0,
                                       0.1, 50)
        _, dL_new, _ = loss.evaluate(f + Fs)
        rho_new = beta + s + C * dL_new
        exact = np.sqrt(rho_new @ space.riesz(rho_new))
        got = _gradient_norm_from_residual(space, loss, state, f, Fs, dL, dL_new, r, Rr, C)
        assert got == pytest.approx(exact, rel=1e-4)
        assert np.any(np.abs(dL_new - dL - loss.hess_apply(state, f, Fs)) > 1e-9)  # pairs moved


def test_grown_gram_refuses_when_reuse_does_not_pay():
    rng = np.random.default_rng(12)
    spec = KernelSpec("rbf", 0.4, 3, 1.0)
    X, ids = rng.random((100, 3)), np.arange(100)
    G = GramMatrix(X, spec, cache_bytes=1e9, ids=ids)
    assert G.grown(X[20:], ids[20:], 1e9) is None            # 20% of the slots dead
    assert G.grown(X, ids + 500, 1e9) is None                # nothing in common
    assert G.grown(X, ids.astype(str), 1e9) is None          # other kind of ids
    assert G.grown(X[:, :2], ids, 1e9) is None               # other features
    linear = GramMatrix(X, KernelSpec("linear", 1.0, 3, 0.0), cache_bytes=1e9, ids=ids)
    assert linear.factored and linear.grown(X, ids, 1e9) is None


def test_refit_of_the_same_estimator_reuses_q_and_finds_the_cold_solution(tmp_path):
    X, y, query = _ranking_data(seed=16, n_queries=40)
    ids = np.arange(len(y)) * 7
    old = np.arange(len(y)) % 50 != 0  # 2% of the judgments arrive later
    model = KernelRankSVM(C=1.0, tol=1e-5).fit(X[old], y[old], query[old], ids=ids[old])
    n_old = model._gram.n
    model.fit(X, y, query, ids=ids, warm_start=model.warm_state())
    assert model._gram.n_reused == n_old and model._gram.n_grown == 1
    cold = KernelRankSVM(C=1.0, tol=1e-5, keep_gram=False).fit(X, y, query, ids=ids)
    assert cold._gram is None
    np.testing.assert_allclose(model.decision_function(X), cold.decision_function(X),
                               rtol=1e-3, atol=1e-3)
    assert model.objective_ == pytest.approx(cold.objective_, rel=1e-4)
    # other kernel parameters: a fresh Q; the saved model carries no Q
    model.set_params(gamma=0.5).fit(X, y, query, ids=ids)
    assert model._gram.n_reused == 0
    model.save(tmp_path / "m")
    assert getattr(KernelRankSVM.load(tmp_path / "m"), "_gram", None) is None


def test_linear_kernel_products_are_factored_and_exact():
    rng = np.random.default_rng(6)
    X = rng.random((100, 4))
    G = GramMatrix(X, KernelSpec("linear", 1.0, 3, 0.0), cache_bytes=1e9)
    assert G.factored and G.nbytes == 0
    v = rng.normal(size=100)
    np.testing.assert_allclose(G.matvec(v), X @ (X.T @ v), rtol=1e-12)


def test_cache_size_small_and_large_give_the_same_solution():
    X, y, query = _ranking_data(seed=7, n_queries=20)
    big = KernelRankSVM(C=1.0, cache_size=100, tol=1e-6).fit(X, y, query)
    small = KernelRankSVM(C=1.0, cache_size=0.01, tol=1e-6).fit(X, y, query)  # 10 kB: ~50 rows
    np.testing.assert_allclose(small.decision_function(X), big.decision_function(X),
                               rtol=1e-4, atol=1e-4)


# --------------------------------------------------------------------------------------------
# TRON: optimality of (3.13)
# --------------------------------------------------------------------------------------------


def test_tron_solution_meets_the_optimality_condition_of_3_13():
    rng = np.random.default_rng(8)
    qptr, level = _layout(rng, n_queries=10, max_docs=12)
    n = qptr[-1]
    P = _pairs(qptr, level)
    X = rng.normal(size=(n, 4))
    C = 2.0
    G = GramMatrix(X, KernelSpec("rbf", 0.25, 3, 1.0), cache_bytes=1e9)
    loss = PairLoss(qptr, level)
    # tol 1e-7: Q is float32, whose round-off floors the relative gradient norm near 1e-8 to
    # 1e-6 depending on the BLAS kernels (TRON then stops on "round-off", unconverged); the
    # KKT checks below, in float64, are what this test asks of the solution
    res = tron(KernelSpace(G), loss, C, tol=1e-7, max_iter=200)
    assert res.converged or ("round-off" in res.message
                             and res.grad_norm <= 1e-6 * res.grad_norm0), res
    Q = G.dense()
    beta = res.theta
    # KKT of (3.13): ∇F = Q(β + C ∇L(Qβ)) = 0; Q is positive definite here, so β = −C ∇L.
    # Checked in float64 against the solver's float32 Q: Qβ differs by ~1e-6 between the two,
    # which moves the relative gradient norm by ~1e-6, hence 1e-5 here
    rho = beta + C * loss.evaluate(Q @ beta)[1]
    assert np.sqrt(rho @ Q @ rho) <= 1e-5 * res.grad_norm0
    np.testing.assert_allclose(beta, -C * loss.evaluate(Q @ beta)[1], atol=1e-4)

    def F(b):
        return 0.5 * b @ Q @ b + C * _loss_ref(Q @ b, P, None)

    ref = minimize(F, np.zeros(n), jac=lambda b: Q @ (b + C * loss.evaluate(Q @ b)[1]),
                   method="L-BFGS-B", options={"maxiter": 5000, "gtol": 1e-10, "ftol": 1e-14})
    assert F(beta) <= ref.fun * (1 + 1e-7)


def test_tron_stopping_rule_is_relative_to_beta_zero():
    X, y, query = _ranking_data(seed=9)
    for tol in (1e-1, 1e-3):
        model = KernelRankSVM(C=1.0, tol=tol).fit(X, y, query)
        assert model.converged_
    loose = KernelRankSVM(C=1.0, tol=1e-1).fit(X, y, query)
    tight = KernelRankSVM(C=1.0, tol=1e-6).fit(X, y, query)
    assert loose.objective_ >= tight.objective_ - 1e-9
    assert loose.n_iter_ < tight.n_iter_


# --------------------------------------------------------------------------------------------
# Frank-Wolfe: duality gap and agreement with TRON
# --------------------------------------------------------------------------------------------


def test_frank_wolfe_duality_gap_closes_on_the_pairwise_dual():
    rng = np.random.default_rng(10)
    qptr, level = _layout(rng, n_queries=8, max_docs=9)
    n = qptr[-1]
    P = _pairs(qptr, level)
    X = rng.normal(size=(n, 3))
    C = 0.5
    G = GramMatrix(X, KernelSpec("rbf", 0.5, 3, 1.0), cache_bytes=1e9)
    res = frank_wolfe(KernelSpace(G), PairLoss(qptr, level), C, len(P), tol=1e-5,
                      max_iter=20000)
    assert res.converged and res.gap <= 1e-5 * C * len(P)
    Q = G.dense()
    beta = res.theta
    primal = 0.5 * beta @ Q @ beta + C * np.sum(np.maximum(0, 1 - (Q @ beta)[P[:, 0]]
                                                           + (Q @ beta)[P[:, 1]]))
    # the gap is P(w) − g(α): primal minus the reported dual value
    assert primal - res.dual_objective == pytest.approx(res.gap, abs=1e-4 * C * len(P))
    # reference: the dual (2) over explicit pairs, solved by L-BFGS-B
    A = np.zeros((len(P), n))
    A[np.arange(len(P)), P[:, 0]] = 1.0
    A[np.arange(len(P)), P[:, 1]] = -1.0
    H = A @ Q @ A.T
    ref = minimize(lambda a: 0.5 * a @ H @ a - a.sum(), np.zeros(len(P)),
                   jac=lambda a: H @ a - 1.0, bounds=[(0, C)] * len(P), method="L-BFGS-B",
                   options={"maxiter": 20000, "ftol": 1e-15, "gtol": 1e-12})
    best_dual = -ref.fun
    assert res.dual_objective <= best_dual + 1e-6
    assert primal >= best_dual - 1e-6
    assert primal - best_dual <= 1e-5 * C * len(P) + 1e-6


def test_frank_wolfe_and_tron_rank_the_test_set_alike():
    X, y, query = _ranking_data(seed=11, n_queries=30)
    Xte, _, _ = _ranking_data(seed=12, n_queries=10)
    fw = KernelRankSVM(C=0.5, loss="hinge", solver="frank_wolfe", tol=1e-5,
                       max_iter=20000).fit(X, y, query)
    tr = KernelRankSVM(C=0.5, loss="hinge", tol=1e-6).fit(X, y, query)
    assert fw.converged_ and tr.converged_
    rho = spearmanr(fw.decision_function(Xte), tr.decision_function(Xte))[0]
    assert rho > 0.995
    sq = KernelRankSVM(C=0.5).fit(X, y, query)  # the other loss still ranks alike
    assert spearmanr(sq.decision_function(Xte), tr.decision_function(Xte))[0] > 0.95


# --------------------------------------------------------------------------------------------
# warm start
# --------------------------------------------------------------------------------------------


def test_warm_start_from_its_own_state_stops_at_once():
    X, y, query = _ranking_data(seed=13)
    cold = KernelRankSVM(C=1.0).fit(X, y, query)
    warm = KernelRankSVM(C=1.0).fit(X, y, query, warm_start=cold.warm_state())
    assert warm.n_iter_ <= 2 and warm.converged_
    np.testing.assert_allclose(warm.decision_function(X), cold.decision_function(X),
                               rtol=1e-4, atol=1e-4)


def test_warm_start_after_new_judgments_keyed_by_id():
    X, y, query = _ranking_data(seed=14, n_queries=40)
    ids = np.array([f"doc{i}" for i in range(len(y))])
    rng = np.random.default_rng(0)
    old = np.sort(rng.permutation(len(y))[: int(0.95 * len(y))])
    cold_old = KernelRankSVM(C=1.0, tol=1e-4).fit(X[old], y[old], query[old], ids=ids[old])
    state = cold_old.warm_state()
    assert state["ids"].dtype.kind == "U" and state["beta"].dtype == np.float64
    perm = rng.permutation(len(y))  # new rows, shuffled order: matching is by id only
    cold = KernelRankSVM(C=1.0, tol=1e-4).fit(X[perm], y[perm], query[perm], ids=ids[perm])
    warm = KernelRankSVM(C=1.0, tol=1e-4).fit(X[perm], y[perm], query[perm], ids=ids[perm],
                                              warm_start=state)
    assert warm.converged_ and warm.n_iter_ < cold.n_iter_
    np.testing.assert_allclose(warm.decision_function(X), cold.decision_function(X),
                               rtol=1e-2, atol=1e-2)
    assert abs(warm.objective_ - cold.objective_) <= 1e-3 * abs(cold.objective_)


def test_warm_start_frank_wolfe_and_hinge():
    X, y, query = _ranking_data(seed=15)
    for params in ({"loss": "hinge", "solver": "frank_wolfe", "tol": 1e-4, "max_iter": 5000},
                   {"loss": "hinge"}):
        cold = KernelRankSVM(C=0.5, **params).fit(X, y, query)
        warm = KernelRankSVM(C=0.5, **params).fit(X, y, query, warm_start=cold.warm_state())
        assert warm.converged_ and warm.n_iter_ <= cold.n_iter_
        assert spearmanr(warm.decision_function(X), cold.decision_function(X))[0] > 0.99


def test_warm_state_checks():
    X, y, query = _ranking_data(seed=16)
    model = KernelRankSVM().fit(X, y, query)
    state = model.warm_state()
    with pytest.raises(ValueError, match="lacks"):
        KernelRankSVM().fit(X, y, query, warm_start={"ids": state["ids"]})
    bad = dict(state, algorithm=np.array("TopPush"))
    with pytest.raises(ValueError, match="'TopPush' model, this is a 'KernelRankSVM'"):
        KernelRankSVM().fit(X, y, query, warm_start=bad)
    with pytest.raises(ValueError, match="ids but"):
        KernelRankSVM().fit(X, y, query, warm_start=dict(state, beta=state["beta"][:-1]))
    nan_beta = state["beta"].copy()
    nan_beta[2] = np.nan
    with pytest.raises(ValueError, match=r"warm_start\['beta'\] contains nan at position 2"):
        KernelRankSVM().fit(X, y, query, warm_start=dict(state, beta=nan_beta))


# --------------------------------------------------------------------------------------------
# Nyström
# --------------------------------------------------------------------------------------------


def test_nystroem_with_enough_components_is_close_to_exact():
    X, y, query = _ranking_data(seed=17, n_queries=20)
    Xte, yte, qte = _ranking_data(seed=18, n_queries=10)
    exact = KernelRankSVM(C=1.0, tol=1e-6).fit(X, y, query)
    full = KernelRankSVM(C=1.0, tol=1e-6, approximation="nystroem", n_components=len(y),
                         random_state=0).fit(X, y, query)
    assert full.converged_
    np.testing.assert_allclose(full.decision_function(Xte), exact.decision_function(Xte),
                               rtol=1e-3, atol=1e-3)
    small = KernelRankSVM(C=1.0, approximation="nystroem", n_components=60,
                          random_state=0).fit(X, y, query)
    assert len(small.support_) == 60
    assert spearmanr(small.decision_function(Xte), exact.decision_function(Xte))[0] > 0.95
    warm = KernelRankSVM(C=1.0, approximation="nystroem", n_components=60,
                         random_state=0).fit(X, y, query, warm_start=small.warm_state())
    assert warm.n_iter_ <= 2
    # other landmarks: the warm start goes through the per-instance β instead
    other = KernelRankSVM(C=1.0, approximation="nystroem", n_components=60,
                          random_state=1).fit(X, y, query, warm_start=small.warm_state())
    assert other.converged_
    fw = KernelRankSVM(C=1.0, loss="hinge", solver="frank_wolfe", tol=1e-4, max_iter=20000,
                       approximation="nystroem", n_components=60, random_state=0)
    fw.fit(X, y, query)
    assert fw.converged_
    assert spearmanr(fw.decision_function(Xte), small.decision_function(Xte))[0] > 0.95


# --------------------------------------------------------------------------------------------
# estimator behaviour and errors
# --------------------------------------------------------------------------------------------


def test_support_predict_rank_and_save_load(tmp_path):
    X, y, query = _ranking_data(seed=19)
    query = query.astype(str)
    # one query with one relevance level only: it adds no pair, its rows get β = 0
    y[query == "0"] = 1.0
    model = KernelRankSVM(C=1.0).fit(X, y, query)
    assert not np.isin(np.flatnonzero(query == "0"), model.support_).any()
    scores = model.decision_function(X)
    Q = _rbf(X, model.gamma_)
    np.testing.assert_allclose(scores, Q[:, model.support_] @ model.dual_coef_, rtol=1e-10)
    order = model.rank(X, query)
    position = model.predict_rank(X, query)
    for q in np.unique(query):
        rows = np.flatnonzero(query == q)
        ranked = rows[np.argsort(-scores[rows], kind="stable")]
        np.testing.assert_array_equal(position[ranked], np.arange(rows.size))
    assert sorted(order) == list(range(len(y)))
    model.save(tmp_path / "m")
    loaded = KernelRankSVM.load(tmp_path / "m")
    np.testing.assert_array_equal(loaded.decision_function(X), scores)
    assert loaded.get_params() == model.get_params()


@pytest.mark.parametrize("kernel", ["linear", "poly"])
def test_other_kernels_fit(kernel):
    X, y, query = _ranking_data(seed=20)
    model = KernelRankSVM(kernel=kernel, C=0.1, gamma=0.2).fit(X, y, query)
    assert model.converged_
    assert query_pairwise_accuracy(query, y, model.decision_function(X)) > 0.7


def test_convergence_warning_and_not_fitted():
    X, y, query = _ranking_data(seed=21)
    with pytest.warns(ConvergenceWarning, match="max_iter=1"):
        KernelRankSVM(max_iter=1, tol=1e-15).fit(X, y, query)
    with pytest.warns(ConvergenceWarning, match="max_iter"):
        KernelRankSVM(loss="hinge", solver="frank_wolfe", max_iter=1, tol=1e-15).fit(
            X, y, query)
    with pytest.raises(NotFittedError):
        KernelRankSVM().decision_function(X)


def test_errors_name_both_values():
    X, y, query = _ranking_data(seed=22)
    model = KernelRankSVM().fit(X, y, query)
    with pytest.raises(ValueError, match="X has 4 features, the model was trained with 5"):
        model.decision_function(X[:, :4])
    with pytest.raises(ValueError, match=r"y has shape \(179,\), expected \(180,\)"):
        KernelRankSVM().fit(X, y[:-1], query)
    with pytest.raises(ValueError, match=r"query has shape \(10,\), expected \(180,\)"):
        KernelRankSVM().fit(X, y, query[:10])
    Xn = X.copy()
    Xn[7, 2] = np.nan
    with pytest.raises(ValueError, match=r"X contains nan at position \(7, 2\)"):
        KernelRankSVM().fit(Xn, y, query)
    yn = y.copy()
    yn[3] = np.nan
    with pytest.raises(ValueError, match="y contains nan at position 3"):
        KernelRankSVM().fit(X, yn, query)
    with pytest.raises(ValueError, match="none of the 180 queries has two documents"):
        KernelRankSVM().fit(X, y, np.arange(180))  # one document per query
    with pytest.raises(ValueError, match="none of the 15 queries"):
        KernelRankSVM().fit(X, np.ones(180), query)
    with pytest.raises(ValueError, match="solver='frank_wolfe'.*loss is 'squared_hinge'"):
        KernelRankSVM(solver="frank_wolfe").fit(X, y, query)
    with pytest.raises(ValueError, match="kernel is 'sigmoid'"):
        KernelRankSVM(kernel="sigmoid").fit(X, y, query)
    with pytest.raises(ValueError, match="ids are not unique"):
        KernelRankSVM().fit(X, y, query, ids=np.zeros(180, dtype=int))


def test_constructor_only_stores_and_warm_up():
    model = KernelRankSVM(C=3.0, gamma=0.1)
    assert model.C == 3.0 and model.gamma == 0.1
    assert not [a for a in vars(model) if a.endswith("_")]
    with pytest.raises(TypeError):
        KernelRankSVM(1.0)
    seconds = KernelRankSVM.warm_up()
    assert isinstance(seconds, float)
    # the kernels of the default fit (RBF, squared hinge, TRON) are compiled
    for kernel in (_k.argsort_segments, _k.pair_counts_total, _k.pair_sums,
                   _k.rbf_from_dot_f32, _k.rbf_pack_lower_f32, _k.packed_symv):
        assert kernel.signatures, kernel
    # and a fit right after it converges and orders the pairs of unseen queries
    X, y, query = _ranking_data(seed=22, n_queries=30)
    Xte, yte, qte = _ranking_data(seed=23, n_queries=10)
    model = KernelRankSVM(C=1.0).fit(X, y, query)
    assert model.converged_
    assert query_pairwise_accuracy(qte, yte, model.decision_function(Xte)) > 0.8


# --------------------------------------------------------------------------------------------
# per-query metrics against brute force
# --------------------------------------------------------------------------------------------


def _ref_metrics(query, labels, scores, k, discount):
    ndcg, ap, defined = [], [], []
    for q in np.unique(query):
        rows = np.flatnonzero(query == q)
        ranked = rows[sorted(range(rows.size), key=lambda t: (-scores[rows[t]], t))]
        ideal = sorted(labels[rows], reverse=True)

        def dcg(labs):
            out = 0.0
            for r, lab in enumerate(labs[:k], start=1):
                d = 1 / np.log2(max(2, r)) if discount == "letor" else 1 / np.log2(r + 1)
                out += (2.0 ** lab - 1) * d
            return out

        best = dcg(ideal)
        ndcg.append(dcg(list(labels[ranked])) / best if best > 0 else 0.0)
        rel = labels[ranked] > 0
        hits, total = 0, 0.0
        for r, is_rel in enumerate(rel, start=1):
            if is_rel:
                hits += 1
                total += hits / r
        ap.append(total / hits if hits else 0.0)
        defined.append(best > 0)
    return np.array(ndcg), np.array(ap), np.array(defined)


@settings(max_examples=40, deadline=None)
@given(st.integers(0, 2**31 - 1), st.integers(1, 12), st.sampled_from(["letor", "log2"]))
def test_query_metrics_match_brute_force(seed, k, discount):
    rng = np.random.default_rng(seed)
    n = int(rng.integers(1, 60))
    query = rng.integers(0, 6, n)
    labels = rng.integers(0, 3, n).astype(float)
    scores = rng.integers(0, 5, n).astype(float)  # ties
    ndcg, ap, defined = _ref_metrics(query, labels, scores, k, discount)
    assert query_ndcg(query, labels, scores, k, discount=discount) == pytest.approx(ndcg.mean())
    assert query_average_precision(query, labels, scores) == pytest.approx(ap.mean())
    if defined.any():
        assert query_ndcg(query, labels, scores, k, discount=discount, no_relevant="skip") \
            == pytest.approx(ndcg[defined].mean())
        assert query_average_precision(query, labels, scores, no_relevant="skip") \
            == pytest.approx(ap[defined].mean())
    P = [(i, j) for i in range(n) for j in range(n)
         if query[i] == query[j] and labels[i] > labels[j]]
    if P:
        right = sum(scores[i] > scores[j] for i, j in P)
        tied = sum(scores[i] == scores[j] for i, j in P)
        assert query_pairwise_accuracy(query, labels, scores) == pytest.approx(right / len(P))
        assert query_pairwise_accuracy(query, labels, scores, ties=0.5) \
            == pytest.approx((right + 0.5 * tied) / len(P))
    else:
        with pytest.raises(ValueError, match="no pairs"):
            query_pairwise_accuracy(query, labels, scores)


def test_query_metrics_per_query_and_errors():
    mean, ids, values = query_ndcg(["b", "a", "a"], [1, 0, 2], [0.0, 1.0, 2.0], per_query=True)
    assert list(ids) == ["a", "b"] and values.tolist() == [1.0, 1.0] and mean == 1.0
    with pytest.raises(ValueError, match="lengths 3, 3 and 2"):
        query_ndcg([0, 0, 0], [1, 0, 1], [1.0, 2.0])
    with pytest.raises(ValueError, match="no_relevant is 'drop'"):
        query_ndcg([0], [1], [1.0], no_relevant="drop")


# --------------------------------------------------------------------------------------------
# layout
# --------------------------------------------------------------------------------------------


def test_pair_layout_drops_rows_without_pairs():
    y = np.array([0, 1, 2, 0, 0, 3, 1, 1, 2.5])
    query = np.array([5, 5, 5, 7, 7, 9, 2, 2, 2])
    rows, qptr, level, n_pairs, n_queries = _pair_layout(y, query)
    assert n_queries == 4 and n_pairs == 3 + 2
    assert sorted(rows.tolist()) == [0, 1, 2, 6, 7, 8]
    for q in range(qptr.size - 1):
        seg = rows[qptr[q]:qptr[q + 1]]
        assert len(set(query[seg])) == 1
        np.testing.assert_array_equal(level[qptr[q]:qptr[q + 1]],
                                      np.unique(y[seg], return_inverse=True)[1].ravel())


# --------------------------------------------------------------------------------------------
# real data: one MQ2008 fold
# --------------------------------------------------------------------------------------------


def _load_letor(path):
    from sklearn.datasets import load_svmlight_file

    with gzip.open(path, "rb") as fh:
        X, y, q = load_svmlight_file(fh, query_id=True)
    return X.toarray(), y, q


def test_mq2008_fold1(shared_data):
    folder = shared_data / "letor4-mq2008" / "Fold1"
    if not folder.is_dir():
        pytest.skip(f"LETOR MQ2008 not found at {folder}")
    X, y, q = _load_letor(folder / "train.txt.gz")
    Xte, yte, qte = _load_letor(folder / "test.txt.gz")
    with warnings.catch_warnings():
        warnings.simplefilter("error", ConvergenceWarning)
        model = KernelRankSVM(C=0.1, gamma=2**-4, tol=1e-2).fit(X, y, q)
    scores = model.decision_function(Xte)
    assert query_ndcg(qte, yte, scores, 10) > 0.47          # pairwise LinearSVC: 0.49
    assert query_ndcg(qte, yte, scores, 10, no_relevant="skip") > 0.65
    assert query_pairwise_accuracy(qte, yte, scores) > 0.6
    assert model.n_pairs_ == 52325
