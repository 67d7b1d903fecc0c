"""Numba kernels for TopPush (Li, Jin, Zhou, "Top Rank Optimization in Linear Time"). Plain
arrays only: no validation, no Python objects; the estimator in ``solvers/toppush.py`` checks
inputs and dispatches.

Notation shared by every kernel below. The N = m + n training rows are stored positives first:
rows 0..m-1 are x⁺_1..x⁺_m, rows m..N-1 are x⁻_1..x⁻_n, either as CSR arrays
(``indptr, indices, data``) or as a dense C-contiguous (N, d) array. The dual variables are one
vector ``gam = [α; β]`` of length N. With the signed combination

    ν(α, β) = αᵀX⁺ − βᵀX⁻ = Σ_i c_i x_i,   c = [α; −β]                         (a d-vector)

the primal problem (paper eq. 6, λ = ``reg``) and its dual (eqs. 7-9) are

    P(w) = λ/2 ‖w‖² + 1/m Σ_i ℓ(max_j wᵀx⁻_j − wᵀx⁺_i)                           (6)
    min_{(α,β) ∈ Ξ} g(α, β) = 1/(2λm) ‖ν‖² + Σ_i ℓ*(α_i)                          (7)
    Ξ = {α ≥ 0, β ≥ 0, 1ᵀα = 1ᵀβ}                                                 (8)
    w = ν / (λm)                                                                   (9)

and strong duality reads min P = −(min g)/m. Losses (``loss`` code) and their conjugates:

    0 truncated quadratic ℓ(z) = [1 + z]₊²   ℓ*(a) = a²/4 − a                  a ≥ 0
    1 logistic            ℓ(z) = log(1+eᶻ)   ℓ*(a) = a log a + (1−a) log(1−a)  0 ≤ a ≤ 1
    2 exponential         ℓ(z) = eᶻ          ℓ*(a) = a log a − a               a ≥ 0

For the truncated quadratic loss (the paper's) a step of Algorithm 1 is a gradient step on all
of g followed by the Euclidean projection onto Ξ (Algorithm 2). The iteration loop itself (and
what it adds to the paper: momentum restart, shrinking) is ``_solve`` in ``solvers/toppush.py``,
because its one full product X ν per iteration is fastest through scipy's CSR kernel or BLAS.

The conjugates of the logistic and exponential losses have unbounded slope at the boundary of
their domain (ℓ*'(a) = log a → −∞ as a → 0), so a plain gradient step is not defined there;
for those two the same accelerated scheme takes a proximal step instead (gradient step on the
quadratic part only, then the prox of ℓ* fused with the projection onto Ξ through its
multiplier, see :func:`prox_project`).

Random numbers (pivots of the projection) come from a splitmix64 stream whose state is an
argument, so a kernel's result depends only on its inputs.
"""

from __future__ import annotations

import math

import numpy as np
from numba import njit

from solvers._random import next_u64

TRUNCATED_QUADRATIC = 0
LOGISTIC = 1
EXPONENTIAL = 2



# --------------------------------------------------------------------------------------------
# random numbers: splitmix64 (solvers._random); the state lives in a 1-element array
# --------------------------------------------------------------------------------------------


@njit(cache=True)
def _rand_below(state, k):
    """Next splitmix64 output reduced to an integer in [0, k); advances ``state[0]``."""
    state[0], z = next_u64(state[0])
    return np.int64(z % np.uint64(k))


# --------------------------------------------------------------------------------------------
# projection onto Ξ (Proposition 2, Algorithm 2)
# --------------------------------------------------------------------------------------------


@njit(cache=True)
def _partition3(v, lo, hi, u):
    """Three-way partition of v[lo:hi] in place into [< u | == u | > u].

    Returns (lt, gt): v[lo:lt] < u, v[lt:gt] == u, v[gt:hi] > u.
    """
    lt = lo
    i = lo
    gt = hi
    while i < gt:
        x = v[i]
        if x < u:
            v[i] = v[lt]
            v[lt] = x
            lt += 1
            i += 1
        elif x > u:
            gt -= 1
            v[i] = v[gt]
            v[gt] = x
        else:
            i += 1
    return lt, gt


@njit(cache=True)
def _rho(a0, b0, u):
    """ρ(u) of eq. 12 and the number of active terms at u, in one branch-free pass."""
    r = 0.0
    k = 0
    for i in range(a0.shape[0]):
        t = a0[i] - u
        r += max(t, 0.0)
        k += t > 0.0
    for j in range(b0.shape[0]):
        t = b0[j] + u
        r -= max(t, 0.0)
        k += t > 0.0
    return r, k


@njit(cache=True)
def project_equal_sums(a0, b0, alpha, beta, work_a, work_c, rng_state, first_guess):
    """Euclidean projection of (a0, b0) onto Ξ = {α ≥ 0, β ≥ 0, 1ᵀα = 1ᵀβ}; returns γ*.

    Problem (paper eq. 11)::

        min_{α ≥ 0, β ≥ 0} ½‖α − a0‖² + ½‖β − b0‖²   s.t.  1ᵀα = 1ᵀβ

    Solution (Proposition 2): α = [a0 − γ*]₊, β = [b0 + γ*]₊ where γ* is a root of the
    non-increasing piecewise-linear function (eq. 12)

        ρ(γ) = Σ_i [a0_i − γ]₊ − Σ_j [b0_j + γ]₊ = Σ_{a0_i > γ} (a0_i − γ) − Σ_{c_j < γ} (γ − c_j)

    with breakpoints a0_i and c_j = −b0_j. Algorithm 2: randomized selection over the unsettled
    breakpoints. A pivot u splits them; ρ(u) is evaluated from running sums of the breakpoints
    already known to be active at the root (a0_i above it, c_j below it) plus those of the
    split. If ρ(u) > 0 the root lies above u: every a0_i ≤ u is inactive and every c_j ≤ u is
    active. Otherwise the root lies at or below u: every a0_i ≥ u is active and every c_j ≥ u is
    inactive. At least the pivot is settled per round, and in expectation a constant fraction of
    the rest, so the expected cost is O(m + n). When none is left the root is exact (eq. 14):

        γ* = (Σ_active a0_i + Σ_active c_j) / (#active a0 + #active c).

    If nothing is active (every a0_i ≤ 0 ≤ −b0_j), (α, β) = (0, 0) and γ* is returned as 0.

    Before Algorithm 2 runs, up to four Newton steps on ρ from ``first_guess`` (the previous γ*
    in the solver, or 0 when NaN) look for a bracket lo < γ* ≤ hi, each a branch-free pass;
    breakpoints outside the bracket are settled in one more pass, and Algorithm 2 runs on the
    few inside it. Partitioning (Algorithm 2's inner step) is branch-bound on random data, so
    this cuts the projection's cost several-fold inside the solver, where γ* moves little. It
    changes nothing in the result, which is exact either way.

    ``work_a`` (length ≥ m) and ``work_c`` (length ≥ n) are scratch; ``rng_state`` a uint64
    array of length 1 (splitmix64 state for the pivots). The result does not depend on the
    pivots, only the running time does.
    """
    m = a0.shape[0]
    n = b0.shape[0]
    # --- bracket the root with Newton steps (ρ is monotone, so any sign change brackets it)
    lo = -math.inf
    hi = math.inf
    u = first_guess if math.isfinite(first_guess) else 0.0
    for _ in range(4):
        r, k = _rho(a0, b0, u)
        if r > 0.0:
            lo = u
        else:
            hi = u
        if r == 0.0 or k == 0 or (lo > -math.inf and hi < math.inf):
            break
        u = u + r / k
    # --- settle the breakpoints outside (lo, hi), copy the rest
    s_act = 0.0  # sum of active a0 plus sum of active c
    n_act = 0
    ahi = 0
    for i in range(m):
        v = a0[i]
        if v >= hi:
            s_act += v
            n_act += 1
        elif v > lo:
            work_a[ahi] = v
            ahi += 1
    chi = 0
    for j in range(n):
        v = -b0[j]
        if v <= lo:
            s_act += v
            n_act += 1
        elif v < hi:
            work_c[chi] = v
            chi += 1
    # --- Algorithm 2 on the breakpoints inside the bracket
    alo = 0
    clo = 0
    while (ahi - alo) + (chi - clo) > 0:
        r = _rand_below(rng_state, (ahi - alo) + (chi - clo))
        if r < ahi - alo:
            u = work_a[alo + r]
        else:
            u = work_c[clo + r - (ahi - alo)]
        a_lt, a_gt = _partition3(work_a, alo, ahi, u)
        c_lt, c_gt = _partition3(work_c, clo, chi, u)
        # ρ(u) from the a's strictly above u and the c's strictly below u
        sa = 0.0
        for i in range(a_gt, ahi):
            sa += work_a[i]
        sc = 0.0
        for j in range(clo, c_lt):
            sc += work_c[j]
        k = n_act + (ahi - a_gt) + (c_lt - clo)
        rho = (s_act + sa + sc) - k * u
        if rho > 0.0:
            # root above u: a ≤ u inactive (drop), c ≤ u active (settle), keep a > u, c > u
            for j in range(c_lt, c_gt):
                sc += work_c[j]
            s_act += sc
            n_act += c_gt - clo
            alo = a_gt
            clo = c_gt
        else:
            # root at or below u: a ≥ u active (settle), c ≥ u inactive (drop), keep the rest
            for i in range(a_lt, a_gt):
                sa += work_a[i]
            s_act += sa
            n_act += ahi - a_lt
            ahi = a_lt
            chi = c_lt
    if n_act == 0:
        for i in range(m):
            alpha[i] = 0.0
        for j in range(n):
            beta[j] = 0.0
        return 0.0
    gamma = s_act / n_act
    for i in range(m):
        alpha[i] = max(a0[i] - gamma, 0.0)
    for j in range(n):
        beta[j] = max(b0[j] + gamma, 0.0)
    return gamma


# --------------------------------------------------------------------------------------------
# conjugates ℓ* and the prox of ℓ* (logistic, exponential)
# --------------------------------------------------------------------------------------------


@njit(cache=True)
def conj_value(a, loss):
    """ℓ*(a) for the loss code ``loss`` (0 log 0 = 0)."""
    if loss == TRUNCATED_QUADRATIC:
        return 0.25 * a * a - a
    xlogx = a * math.log(a) if a > 0.0 else 0.0
    if loss == LOGISTIC:
        b = 1.0 - a
        return xlogx + (b * math.log(b) if b > 0.0 else 0.0)
    return xlogx - a


@njit(cache=True)
def conj_grad(a, loss):
    """ℓ*'(a) for the loss code ``loss`` (−inf at the boundary of a log-barrier domain)."""
    if loss == TRUNCATED_QUADRATIC:
        return 0.5 * a - 1.0
    if a <= 0.0:
        return -math.inf
    if loss == LOGISTIC:
        return math.log(a) - math.log(1.0 - a) if a < 1.0 else math.inf
    return math.log(a)


@njit(cache=True)
def _prox_conj(v, step_l, loss):
    """argmin_a  step_l/2 (a − v)² + ℓ*(a)  for the logistic or exponential loss.

    Optimality: step_l (a − v) + ℓ*'(a) = 0. Solved for t = log a (exponential: convex
    increasing in t, Newton from a point where the residual is positive converges
    monotonically) or t = logit a (logistic: the root lies in [L(v − 1), L v]; Newton safeguarded
    by bisection). Returns (a, da/dv) with da/dv = 1 / (1 + ℓ*''(a) / step_l).
    """
    lv = step_l * v
    if loss == EXPONENTIAL:
        # f(t) = L e^t − L v + t, f' = L e^t + 1
        t = math.log1p(v) if v >= 0.0 else lv
        for _ in range(100):
            et = math.exp(t)
            f = step_l * et - lv + t
            dt = f / (step_l * et + 1.0)
            t -= dt
            if abs(dt) <= 1e-14 * (1.0 + abs(t)):
                break
        a = math.exp(t)
        return a, a * step_l / (a * step_l + 1.0)
    # logistic: a = σ(t), f(t) = L (σ(t) − v) + t, f' = L σ (1 − σ) + 1
    lo = lv - step_l
    hi = lv
    t = 0.5 * (lo + hi)
    if t < lo or t > hi:
        t = lo
    for _ in range(200):
        if t >= 0.0:
            e = math.exp(-t)
            sig = 1.0 / (1.0 + e)
        else:
            e = math.exp(t)
            sig = e / (1.0 + e)
        f = step_l * (sig - v) + t
        if f > 0.0:
            hi = t
        else:
            lo = t
        tn = t - f / (step_l * sig * (1.0 - sig) + 1.0)
        if not (lo < tn < hi):
            tn = 0.5 * (lo + hi)
        if abs(tn - t) <= 1e-14 * (1.0 + abs(t)) or hi - lo <= 1e-15 * (1.0 + abs(t)):
            t = tn
            break
        t = tn
    if t >= 0.0:
        sig = 1.0 / (1.0 + math.exp(-t))
    else:
        e = math.exp(t)
        sig = e / (1.0 + e)
    q = sig * (1.0 - sig) * step_l
    return sig, q / (q + 1.0)


@njit(cache=True)
def _prox_sum_residual(a0, b0, gamma, step_l, loss, alpha, beta):
    """F(γ) = Σ prox(a0_i − γ) − Σ [b0_j + γ]₊ and F'(γ); fills alpha and beta."""
    sa = 0.0
    da = 0.0
    for i in range(a0.shape[0]):
        a, d = _prox_conj(a0[i] - gamma, step_l, loss)
        alpha[i] = a
        sa += a
        da += d
    sb = 0.0
    nb = 0
    for j in range(b0.shape[0]):
        v = b0[j] + gamma
        if v > 0.0:
            beta[j] = v
            sb += v
            nb += 1
        else:
            beta[j] = 0.0
    return sa - sb, -da - nb, sa + sb


@njit(cache=True)
def prox_project(a0, b0, step_l, loss, alpha, beta, gamma0):
    """Proximal step of ℓ* fused with the projection onto Ξ; returns the multiplier γ.

    Problem (the composite step of Algorithm 1 for a non-quadratic ℓ*)::

        min_{(α, β) ∈ Ξ} L/2 ‖α − a0‖² + L/2 ‖β − b0‖² + Σ_i ℓ*(α_i)

    With a multiplier γ for 1ᵀα = 1ᵀβ: α_i = prox_{ℓ*/L}(a0_i − γ), β_j = [b0_j + γ]₊, and γ is
    the root of F(γ) = 1ᵀα(γ) − 1ᵀβ(γ), which is strictly decreasing. The root is bracketed by
    doubling from ``gamma0`` and found by Newton steps safeguarded by bisection, to
    |F| ≤ 1e-13 (1ᵀα + 1ᵀβ) or a bracket of relative width 1e-15.
    """
    g = gamma0 if math.isfinite(gamma0) else 0.0
    f, df, scale = _prox_sum_residual(a0, b0, g, step_l, loss, alpha, beta)
    if f == 0.0:
        return g
    # bracket [lo, hi] with F(lo) > 0 > F(hi)
    width = 1.0
    if f > 0.0:
        lo = g
        hi = g + width
        for _ in range(2100):  # F changes sign within ~1000 doublings for any finite input
            fh, dfh, sc = _prox_sum_residual(a0, b0, hi, step_l, loss, alpha, beta)
            if fh <= 0.0:
                break
            lo = hi
            width *= 2.0
            hi = hi + width
    else:
        hi = g
        lo = g - width
        for _ in range(2100):
            fl, dfl, sc = _prox_sum_residual(a0, b0, lo, step_l, loss, alpha, beta)
            if fl >= 0.0:
                break
            hi = lo
            width *= 2.0
            lo = lo - width
    g = 0.5 * (lo + hi)
    for _ in range(200):
        f, df, scale = _prox_sum_residual(a0, b0, g, step_l, loss, alpha, beta)
        if abs(f) <= 1e-13 * scale or hi - lo <= 1e-15 * (1.0 + abs(g)):
            break
        if f > 0.0:
            lo = g
        else:
            hi = g
        gn = g - f / df if df < 0.0 else 0.5 * (lo + hi)
        if not (lo < gn < hi):
            gn = 0.5 * (lo + hi)
        g = gn
    else:
        _prox_sum_residual(a0, b0, g, step_l, loss, alpha, beta)  # arrays at the returned γ
    return g


# --------------------------------------------------------------------------------------------
# pieces of one iteration of Algorithm 1 (the loop itself is ``_solve`` in solvers/toppush.py)
# --------------------------------------------------------------------------------------------


@njit(cache=True)
def signed_combination(is_sparse, indptr, indices, data, dense, m, gam, out):
    """out = ν = Σ_{i<m} gam_i x_i − Σ_{i≥m} gam_i x_i (eq. 9 times λm), float64 accumulation.

    Rows with gam_i = 0 are skipped: the duals are sparse (only the highest-scored negatives
    carry β > 0), so this costs the non-zeros of the rows with a non-zero dual, not all of X.
    """
    for k in range(out.shape[0]):
        out[k] = 0.0
    n_rows = gam.shape[0]
    if is_sparse:
        p = indptr[0]
        for i in range(n_rows):
            end = indptr[i + 1]
            c = gam[i]
            if c == 0.0:
                p = end
                continue
            if i >= m:
                c = -c
            while p < end:
                out[indices[p]] += c * data[p]
                p += 1
    else:
        for i in range(n_rows):
            c = gam[i]
            if c == 0.0:
                continue
            if i >= m:
                c = -c
            for k in range(out.shape[0]):
                out[k] += c * dense[i, k]


@njit(cache=True)
def dual_objective(nu, gam, m, reg, loss):
    """g(α, β) of eq. 7 from ν = αᵀX⁺ − βᵀX⁻ and the duals."""
    q = 0.0
    for k in range(nu.shape[0]):
        q += nu[k] * nu[k]
    s = 0.0
    for i in range(m):
        s += conj_value(gam[i], loss)
    return q / (2.0 * reg * m) + s


@njit(cache=True)
def loss_value(t, loss):
    """ℓ(t) for the loss code ``loss`` (logistic without overflow; exponential may be inf)."""
    if loss == TRUNCATED_QUADRATIC:
        u = 1.0 + t
        return u * u if u > 0.0 else 0.0
    if loss == LOGISTIC:
        return t + math.log1p(math.exp(-t)) if t > 0.0 else math.log1p(math.exp(t))
    return math.exp(t)


@njit(cache=True)
def primal_objective(z, nu, m, reg, loss):
    """P(w) of eq. 6 at w = ν/(λm) (eq. 9) from the scores z = X ν of the rows at hand::

        P = ‖ν‖²/(2λm²) + 1/m Σ_{i<m} ℓ((max_{j≥m} z_j − z_i)/(λm))

    Rows 0..m−1 of ``z`` are the positives, the rest negatives; the maximum is over the
    negatives present in ``z`` (all of them, or the solver's working set).
    """
    lm = reg * m
    top = -math.inf
    for j in range(m, z.shape[0]):
        if z[j] > top:
            top = z[j]
    s = 0.0
    for i in range(m):
        s += loss_value((top - z[i]) / lm, loss)
    q = 0.0
    for k in range(nu.shape[0]):
        q += nu[k] * nu[k]
    return q / (2.0 * lm * m) + s / m


@njit(cache=True)
def dual_gradient(z, gam, m, reg, loss, smooth_only, grad):
    """∇g of eq. 7 at ``gam`` from its scores z = X ν(gam) (eq. 10)::

        ∇_α g = z⁺/(λm) + ℓ*'(α)      ∇_β g = −z⁻/(λm)

    With ``smooth_only`` the ℓ*' term is left out (the quadratic part only, as used by the
    proximal step of the logistic and exponential losses).
    """
    lm = reg * m
    for i in range(m):
        g = z[i] / lm
        if not smooth_only:
            g += conj_grad(gam[i], loss)
        grad[i] = g
    for i in range(m, gam.shape[0]):
        grad[i] = -z[i] / lm


@njit(cache=True)
def search_point(gam, gam_prev, nu, nu_prev, omega, s, nu_s):
    """Algorithm 1, step 5: s = x_k + ω (x_k − x_{k−1}) and ν(s) (ν is linear in the duals)."""
    for i in range(gam.shape[0]):
        s[i] = gam[i] + omega * (gam[i] - gam_prev[i])
    for k in range(nu.shape[0]):
        nu_s[k] = nu[k] + omega * (nu[k] - nu_prev[k])


@njit(cache=True)
def line_search(is_sparse, indptr, indices, data, dense, m, reg, loss, s, z, nu_s, big_l,
                gamma, gam_new, nu_new, grad, x0, work_a, work_c, rng_state):
    """Algorithm 1, steps 6-14: gradient at s, then L-search for the projected step.

    Gradient (eq. 10), from the scores z = X ν(s)::

        ∇_α g = z⁺/(λm) + ℓ*'(s_α)      ∇_β g = −z⁻/(λm)

    (for the logistic and exponential losses only the quadratic part enters; ℓ* is handled by
    the prox in :func:`prox_project`). Trial step x' = π_Ξ(s − ∇g/L) (Algorithm 2, or the fused
    prox-projection), accepted when

        ‖ν(x') − ν(s)‖²/(λm) [+ ‖x'_α − s_α‖²/2 for the truncated quadratic]  ≤  L ‖x' − s‖²,

    which is g(x') ≤ g(s) + ∇g(s)ᵀ(x' − s) + L/2 ‖x' − s‖² (step 10) for the quadratic part,
    written without its cancelling terms: g is quadratic plus a separable ℓ*, so the test is
    exact and free of round-off near convergence. On failure the paper doubles L (step 13);
    here L becomes max(2L, observed curvature along x' − s), which reaches the right scale in
    one or two trials even from the tiny initial L = 1/(m + n).

    Writes x' into ``gam_new``, ν(x') into ``nu_new`` and the gradient into ``grad``. Returns
    (L, γ of the projection, ‖x' − s‖², number of trials, the curvature of g along the accepted
    step, i.e. the left side above over ‖x' − s‖², which is ≤ L). ``gamma`` (the previous
    multiplier, or NaN) seeds the projection.
    """
    n_rows = s.shape[0]
    lm = reg * m
    quadratic = loss == TRUNCATED_QUADRATIC
    dual_gradient(z, s, m, reg, loss, not quadratic, grad)
    trials = 0
    while True:
        trials += 1
        inv_l = 1.0 / big_l
        for i in range(n_rows):
            x0[i] = s[i] - grad[i] * inv_l
        if quadratic:
            gamma = project_equal_sums(x0[:m], x0[m:], gam_new[:m], gam_new[m:], work_a,
                                       work_c, rng_state, gamma)
        else:
            gamma = prox_project(x0[:m], x0[m:], big_l, loss, gam_new[:m], gam_new[m:], gamma)
        signed_combination(is_sparse, indptr, indices, data, dense, m, gam_new, nu_new)
        dd = 0.0
        da = 0.0
        for i in range(m):
            t = gam_new[i] - s[i]
            da += t * t
        dd = da
        for i in range(m, n_rows):
            t = gam_new[i] - s[i]
            dd += t * t
        if dd == 0.0:
            return big_l, gamma, dd, trials, 0.0
        lhs = 0.0
        for k in range(nu_s.shape[0]):
            t = nu_new[k] - nu_s[k]
            lhs += t * t
        lhs /= lm
        if quadratic:
            lhs += 0.5 * da
        if lhs <= big_l * dd * (1.0 + 1e-12):
            return big_l, gamma, dd, trials, lhs / dd
        curv = lhs / dd
        big_l = 2.0 * big_l if 2.0 * big_l > curv else curv
