"""The projection onto Ξ = {α ≥ 0, β ≥ 0, 1ᵀα = 1ᵀβ} (TopPush, Proposition 2 / Algorithm 2)
and the fused prox-projection of the logistic and exponential losses, each against a slow
reference: a sort-based exact root of ρ (eq. 12), a generic QP solver, and KKT conditions."""

from __future__ import annotations

import numpy as np
import pytest
from scipy.optimize import minimize

from solvers import _toppush_kernels as K


def project_reference(a0, b0):
    """Exact projection by sorting all breakpoints of ρ and interpolating on the right piece."""
    u = np.unique(np.concatenate([a0, -b0]))
    r = (np.maximum(a0[None, :] - u[:, None], 0.0).sum(axis=1)
         - np.maximum(b0[None, :] + u[:, None], 0.0).sum(axis=1))  # ρ at every breakpoint
    nonpos = np.flatnonzero(r <= 0.0)
    if nonpos.size == 0:  # ρ > 0 at every breakpoint: cannot happen (ρ(max u) ≤ 0)
        raise AssertionError("rho positive at the largest breakpoint")
    k = nonpos[0]
    if k == 0:
        g = u[0]
    else:
        g0, g1, r0, r1 = u[k - 1], u[k], r[k - 1], r[k]
        g = g0 + (g1 - g0) * r0 / (r0 - r1)
    return np.maximum(a0 - g, 0.0), np.maximum(b0 + g, 0.0)


def project_qp(a0, b0):
    """The same projection by a generic solver (SLSQP) on the QP of eq. 11."""
    m = a0.size
    x0 = np.zeros(a0.size + b0.size)
    target = np.concatenate([a0, b0])
    res = minimize(lambda x: 0.5 * np.sum((x - target) ** 2), x0,
                   jac=lambda x: x - target, method="SLSQP",
                   bounds=[(0, None)] * x0.size,
                   constraints=[{"type": "eq", "fun": lambda x: x[:m].sum() - x[m:].sum(),
                                 "jac": lambda x: np.r_[np.ones(m), -np.ones(x.size - m)]}],
                   options={"ftol": 1e-14, "maxiter": 500})
    assert res.success, res.message
    return res.x[:m], res.x[m:]


def project(a0, b0, guess=np.nan, seed=1):
    m, n = a0.size, b0.size
    alpha, beta = np.empty(m), np.empty(n)
    state = np.array([seed], dtype=np.uint64)
    gamma = K.project_equal_sums(a0, b0, alpha, beta, np.empty(m), np.empty(n), state, guess)
    return alpha, beta, gamma


def random_case(rng, kind):
    m, n = int(rng.integers(1, 40)), int(rng.integers(1, 40))
    scale = rng.choice([1e-3, 1.0, 1e3])
    a0, b0 = rng.normal(size=m) * scale, rng.normal(size=n) * scale
    if kind == "ties":
        a0, b0 = np.round(a0 / scale * 2) / 2, np.round(b0 / scale * 2) / 2
        b0[: n // 2] = -a0[0] if a0.size else b0[: n // 2]
    elif kind == "zero":
        a0, b0 = np.zeros(m), np.zeros(n)
    elif kind == "negative":
        a0, b0 = -np.abs(a0), -np.abs(b0)
    elif kind == "one_sided":
        a0, b0 = np.abs(a0), -np.abs(b0)
    elif kind == "constant":
        a0, b0 = np.full(m, 0.7), np.full(n, 0.7)
    return a0, b0


KINDS = ["gaussian", "ties", "zero", "negative", "one_sided", "constant"]


@pytest.mark.parametrize("kind", KINDS)
def test_projection_matches_sort_reference(kind):
    rng = np.random.default_rng(KINDS.index(kind))
    for _ in range(1000):
        a0, b0 = random_case(rng, kind)
        ref_a, ref_b = project_reference(a0, b0)
        for guess in (np.nan, float(rng.normal()), float(rng.normal() * 1e3)):
            alpha, beta, _ = project(a0, b0, guess, seed=int(rng.integers(1 << 30)))
            tol = 1e-9 * max(1.0, np.abs(a0).max(), np.abs(b0).max())
            np.testing.assert_allclose(alpha, ref_a, rtol=0, atol=tol)
            np.testing.assert_allclose(beta, ref_b, rtol=0, atol=tol)


def test_projection_matches_generic_qp_solver():
    rng = np.random.default_rng(7)
    for _ in range(60):
        a0, b0 = random_case(rng, "gaussian")
        a0, b0 = a0[:12] / max(1.0, np.abs(a0).max()), b0[:12] / max(1.0, np.abs(b0).max())
        alpha, beta, _ = project(a0, b0)
        qa, qb = project_qp(a0, b0)
        np.testing.assert_allclose(alpha, qa, atol=1e-6)
        np.testing.assert_allclose(beta, qb, atol=1e-6)


def test_projection_kkt_on_large_inputs():
    """Feasible, α = [a0 − γ]₊, β = [b0 + γ]₊ with the returned γ, and sums equal."""
    rng = np.random.default_rng(3)
    for m, n in [(1, 100_000), (50_000, 50_000), (100_000, 3)]:
        a0 = rng.normal(size=m)
        b0 = rng.normal(size=n) - 2.0
        alpha, beta, gamma = project(a0, b0)
        assert alpha.min() >= 0 and beta.min() >= 0
        assert abs(alpha.sum() - beta.sum()) <= 1e-9 * max(1.0, alpha.sum())
        np.testing.assert_array_equal(alpha, np.maximum(a0 - gamma, 0.0))
        np.testing.assert_array_equal(beta, np.maximum(b0 + gamma, 0.0))


def test_projection_of_feasible_point_is_itself():
    rng = np.random.default_rng(4)
    alpha = np.abs(rng.normal(size=30))
    beta = np.zeros(50)
    beta[:7] = np.abs(rng.normal(size=7))
    beta *= alpha.sum() / beta.sum()
    pa, pb, _ = project(alpha, beta)
    np.testing.assert_allclose(pa, alpha, atol=1e-12)
    np.testing.assert_allclose(pb, beta, atol=1e-12)


def test_projection_does_not_depend_on_pivots():
    rng = np.random.default_rng(5)
    a0, b0 = rng.normal(size=500), rng.normal(size=700)
    results = [project(a0, b0, guess, seed)[:2] for seed in range(5)
               for guess in (np.nan, 0.0, 10.0)]
    for alpha, beta in results[1:]:
        np.testing.assert_allclose(alpha, results[0][0], atol=1e-12)
        np.testing.assert_allclose(beta, results[0][1], atol=1e-12)


# --------------------------------------------------------------------------------------------
# fused prox-projection (logistic, exponential)
# --------------------------------------------------------------------------------------------


def conj(a, loss):
    a = np.asarray(a, float)
    with np.errstate(divide="ignore", invalid="ignore"):
        xlogx = np.where(a > 0, a * np.log(np.where(a > 0, a, 1.0)), 0.0)
        if loss == K.LOGISTIC:
            b = 1.0 - a
            return xlogx + np.where(b > 0, b * np.log(np.where(b > 0, b, 1.0)), 0.0)
    return xlogx - a


@pytest.mark.parametrize("loss", [K.LOGISTIC, K.EXPONENTIAL])
def test_prox_projection_matches_generic_solver(loss):
    rng = np.random.default_rng(11 + loss)
    for _ in range(25):
        m, n = int(rng.integers(1, 8)), int(rng.integers(1, 8))
        a0, b0 = rng.normal(size=m), rng.normal(size=n)
        step_l = float(rng.choice([0.5, 2.0, 20.0]))
        alpha, beta = np.empty(m), np.empty(n)
        K.prox_project(a0, b0, step_l, loss, alpha, beta, np.nan)
        assert alpha.min() > 0 and beta.min() >= 0
        assert abs(alpha.sum() - beta.sum()) <= 1e-10 * max(1.0, alpha.sum())
        if loss == K.LOGISTIC:
            assert alpha.max() < 1

        def objective(x):
            return (step_l / 2 * (np.sum((x[:m] - a0) ** 2) + np.sum((x[m:] - b0) ** 2))
                    + conj(x[:m], loss).sum())

        upper = 1.0 if loss == K.LOGISTIC else None
        res = minimize(objective, np.r_[np.full(m, 0.1), np.full(n, 0.1 * m / n)],
                       method="SLSQP",
                       bounds=[(1e-12, upper)] * m + [(0, None)] * n,
                       constraints=[{"type": "eq", "fun": lambda x: x[:m].sum() - x[m:].sum()}],
                       options={"ftol": 1e-14, "maxiter": 1000})
        ours = objective(np.r_[alpha, beta])
        assert ours <= res.fun + 1e-7 * max(1.0, abs(res.fun))
