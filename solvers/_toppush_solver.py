"""TopPush's driver: Nesterov's accelerated projected gradient with line search on the dual
(Li, Jin & Zhou, NIPS 2014, Algorithm 1), state in, result out.

Problem (rows 0..m−1 of X positive, m..N−1 negative, γ = [α; β], ν = αᵀX⁺ − βᵀX⁻)::

    min_{α ≥ 0, β ≥ 0, 1ᵀα = 1ᵀβ}  g = 1/(2λm) ‖ν‖² + Σ_i ℓ*(α_i)                  (7)

whose optimum is −m times that of the primal (6), P(w) = λ/2‖w‖² + 1/m Σ_i ℓ(max_j
wᵀx⁻_j − wᵀx⁺_i), at w = ν/(λm) (9). The projection onto the feasible set (Algorithm 2) and the
line search are in :mod:`solvers._toppush_kernels`. Measurements behind the constants below:
docs/solver-notes.md.
"""

from __future__ import annotations

import numpy as np
import scipy.sparse as sp

from solvers import _toppush_kernels as _k

LOSSES = {
    "truncated_quadratic": _k.TRUNCATED_QUADRATIC,
    "logistic": _k.LOGISTIC,
    "exponential": _k.EXPONENTIAL,
}
# P(0) = ℓ(0), eq. 6 at w = 0 (a primal candidate of the stopping rule, see solve), and ℓ'(0)
LOSS_AT_ZERO = {"truncated_quadratic": 1.0, "logistic": float(np.log(2.0)), "exponential": 1.0}
SLOPE_AT_ZERO = {_k.TRUNCATED_QUADRATIC: 2.0, _k.LOGISTIC: 0.5, _k.EXPONENTIAL: 1.0}
# each line search starts from max(L_SHRINK · L, the curvature measured along the previous
# accepted step) (L_SHRINK = 1 is the paper's rule: L never decreases)
L_SHRINK = 0.5
RESTART = True  # momentum restart when the dual objective goes up (see solve)
# shrinking of low-scored negatives (see solve): every SHRINK_EVERY iterations, with a score
# margin of SHRINK_MARGIN times the score's change since the previous check
SHRINK = True
SHRINK_EVERY = 5
SHRINK_MARGIN = 2.0
# when the stopping rule holds on the shrunk problem but removed negatives would enter: the
# first UNSHRINK_PARTIAL times only those come back (shrinking stays on), then all of them
UNSHRINK_PARTIAL = 3
# CSR input: solve over one row per group of equal negatives (see distinct_rows); dense input
# is used as it is (comparing dense rows costs more than it saves on the data measured)
DISTINCT_NEGATIVES = True
# nearest point of the negatives' hull to the positives' mean (see hull_projection): at most
# HULL_MAX_ITER pairwise Frank-Wolfe steps; "inside" once the distance is below HULL_INSIDE
# times the largest (column-scaled) row norm, "outside" once certified with a Frank-Wolfe gap
# below HULL_REL_GAP times the objective (the distance then known to about 13 %)
HULL_MAX_ITER = 3000
HULL_INSIDE = 1e-9
HULL_REL_GAP = 0.25
# P(w) counts as above P(0) beyond this relative round-off
PRIMAL_ROUNDOFF = 1e-12


def make_feasible(gam, m, loss, rng_state):
    """Project mapped warm-start duals onto Ξ (and α ≤ 1 for the logistic loss)."""
    np.nan_to_num(gam, copy=False, nan=0.0, posinf=0.0, neginf=0.0)
    a0, b0 = gam[:m].copy(), gam[m:].copy()
    _k.project_equal_sums(a0, b0, gam[:m], gam[m:], np.empty(m), np.empty(gam.size - m),
                          rng_state, np.nan)
    if loss == _k.LOGISTIC:
        top = gam[:m].max()
        if top > 1.0:
            gam /= top


def distinct_rows(X):
    """(first, rep) for the rows of a dense array or CSR matrix (sorted indices): ``first`` the
    ascending indices of the first row of each group of equal rows, ``rep[i]`` the first row
    equal to row i (``rep[i] == i`` for the rows in ``first``).

    Eq. 6 sees the negatives only through max_j wᵀx⁻_j, which equal rows do not change, so the
    solver keeps one row per group of equal negatives (w8a: 23,515 distinct of 32,180). Rows
    are grouped by a random projection, then each row is compared entry by entry with its
    group's first row; a row that differs (a collision of the projection) stays on its own, so
    equal means bit-for-bit equal. O(nnz + n log n).
    """
    n = X.shape[0]
    rep = np.arange(n)
    if n < 2:
        return rep.copy(), rep
    sparse = sp.issparse(X)
    key = np.asarray(X @ np.random.default_rng(20140812).standard_normal(X.shape[1])).ravel()
    order = np.argsort(key, kind="stable")  # equal keys: lowest row first
    k = key[order]
    starts = np.r_[True, k[1:] != k[:-1]]
    rep[order] = order[np.maximum.accumulate(np.where(starts, np.arange(n), 0))]
    rows = np.flatnonzero(rep != np.arange(n))
    if rows.size:
        reps = rep[rows]
        if sparse:
            lens = np.diff(X.indptr)
            unequal = lens[rows] != lens[reps]
            same_len = np.flatnonzero(~unequal)
            lens = lens[rows[same_len]]
            seg = np.repeat(same_len, lens)
            within = np.arange(lens.sum()) - np.repeat(np.cumsum(lens) - lens, lens)
            ia, ib = X.indptr[rows][seg] + within, X.indptr[reps][seg] + within
            differ = (X.indices[ia] != X.indices[ib]) | (X.data[ia] != X.data[ib])
            unequal[seg[differ]] = True
        else:
            unequal = np.any(X[rows] != X[reps], axis=1)
        rep[rows[unequal]] = rows[unequal]
    return np.flatnonzero(rep == np.arange(n)), rep


def _kernel_arrays(matrix):
    """(is_sparse, indptr, indices, data, dense) views of a CSR matrix or a dense array."""
    if sp.issparse(matrix):
        # unsigned view of the column indices (no copy): numba then skips its wraparound test
        indices = matrix.indices.view(np.uint32 if matrix.indices.itemsize == 4 else np.uint64)
        return (True, matrix.indptr, indices, matrix.data,
                np.empty((0, 0), dtype=matrix.dtype))
    return (False, np.zeros(1, dtype=np.int32), np.zeros(0, dtype=np.uint32),
            np.zeros(0, dtype=matrix.dtype), matrix)


def _scores(X, vec, vec_dtype):
    """X · vec in float64 (the product itself in the dtype of X)."""
    v = vec if vec_dtype is np.float64 else vec.astype(vec_dtype)
    return np.asarray(X @ v, dtype=np.float64)


def solve(X, m, gam, reg, loss, tol, max_iter, l_init, rng_state, verbose, p_zero):
    """Algorithm 1: minimize the dual (7) over Ξ (8) from the feasible start ``gam``.

    Nesterov's method with t_{k+1} = (1 + sqrt(1 + 4 t_k²))/2 and ω_k = (t_{k−1} − 1)/t_k;
    per iteration one product z = X ν(x_{k+1}) at the new iterate (scipy's CSR kernel or BLAS,
    in the dtype of X: each score is a short row sum, so float32 accumulation is harmless
    there). The scores at the search point s_{k+1} = x_{k+1} + ω(x_{k+1} − x_k), which the
    gradient (10) needs, follow by linearity, X ν(s) = (1 + ω) X ν(x_{k+1}) − ω X ν(x_k), so the
    same product serves the gradient and the stopping rule. The line search is
    :func:`solvers._toppush_kernels.line_search` (projections, and products over the rows with
    a non-zero dual only, in float64). Additions to the paper's algorithm, none of which
    changes the problem or the stopping rule:

    * step size: each line search starts from max(``L_SHRINK``·L, the curvature of g along
      the previous accepted step) instead of the previous L (the paper's L never decreases);
    * momentum restart (O'Donoghue & Candès 2015): when g goes up, t is reset to 1;
    * shrinking (as LIBLINEAR's dual solvers do): only the highest-scored negatives ever carry
      β > 0. Every ``SHRINK_EVERY`` (5) iterations, negatives with β = 0 in the last two
      iterates whose score lies below the activation threshold τ = −γλmL by more than
      ``SHRINK_MARGIN`` (2) times its change since the last check are removed from the
      working problem, so iterations cost O(nnz of the positives and the remaining negatives).
      Removed coordinates
      are 0 in every iterate, so while none of them would have become active the iterates are
      those of the full problem. When the stopping rule holds, the removed negatives are
      scored once; those that would become active (score > τ) or would be the top-scored
      negative (the primal needs the maximum over all negatives) are put back with zero duals
      (so the Nesterov sequence simply continues on the larger problem), and the iterations go
      on until the rule holds again. The first ``UNSHRINK_PARTIAL`` (3) times only those come
      back; the next time every removed negative does and shrinking is switched off, so the
      loop ends like the unshrunk one.

    Stopping rule: the relative duality gap at the iterate x_{k+1}, measured for the better of
    two primal points, w from (9) of the iterate and w = 0. Every feasible (α, β) gives a lower
    bound D = −g(α, β)/m on min P and every w an upper bound P(w); P(0) = ℓ(0) = ``p_zero``
    exactly. Stop after the first iteration with

        min(P(w), P(0)) − D(α, β) ≤ tol · D(α, β)          (min P > 0 for all three losses)

    (or when the accepted step is exactly zero: s is then a fixed point of the projected
    gradient map, hence optimal). Both sides depend only on the iterate, not on where the
    iterations started, so a warm start near the optimum stops at once and a warm start far
    from it does not stop early; on return the better point has P ≤ (1 + tol) · D ≤
    (1 + tol) · min P, i.e. P/min P − 1 ≤ tol, the suboptimality the benchmark measures.
    w = 0 can only win when it is itself within tol of the optimum (a degenerate fit: then
    P(0) − min P ≤ tol · min P, and the w of (9) at which the w-only rule fires has
    P(w) ≈ (1 + tol) · D > P(0), because P is not smooth at the top negative and P(w) − min P
    is first order in ‖w − w*‖ while the dual error is second order); the rule then stops as
    soon as D certifies it and the caller decides what to return (TopPush: eq. 9's w if
    P(w) ≤ P(0), else a point on the steepest-descent ray from 0, see descent_from_zero). P
    needs the
    maximum score over all negatives; the working rows' scores give it while nothing is
    shrunk, and the removed negatives are scored when the rule is about to fire. The gap
    closes more slowly than the dual objective: P is not smooth in w at the top negative, so
    P(w) − min P shrinks like the square root of g − min g. The gap is dominated by the primal
    side (the dual bound is within a few tenths of a percent of min P when the rule fires on
    w8a), and w of eq. 9 at the last iterate is the best primal point measured: the lowest P
    seen so far met the rule at the same iteration, averages of past iterates (weighted by
    t_k, or over the last half) had higher P, and the best rescaled t·w (same ranking) met the
    rule at about the same iteration on w8a and earlier only where it shrank w towards 0
    (docs/solver-notes.md).

    Returns (γ over all N rows, ν, n_iter, converged, last relative gap, final L, g, P(w)):
    g and P at the returned iterate, so −g/m ≤ min P ≤ P(w) (P over the working negatives only
    when the rule fired for w = 0 with negatives shrunk; the caller evaluates P(w) exactly).
    The gap is that of the better of w and 0.
    """
    n_total = gam.shape[0]
    vec_dtype = np.float32 if X.dtype == np.float32 else np.float64
    lm = reg * m
    z_check = np.zeros(n_total - m)  # each negative's score at the last shrinking check
    rows = np.arange(n_total)  # working rows: all positives, the unshrunk negatives
    shrinking = SHRINK and n_total - m > 1

    Xa = X
    arrays = _kernel_arrays(Xa)
    gam = gam.copy()
    gam_prev = gam.copy()
    buf_new, buf_s, buf_x0, buf_grad = (np.empty(n_total) for _ in range(4))
    work_a, work_c = np.empty(m), np.empty(n_total - m)
    nu = np.zeros(X.shape[1])
    _k.signed_combination(*arrays, m, gam, nu)
    nu_prev = nu.copy()
    nu_new = np.empty_like(nu)
    nu_s = np.empty_like(nu)
    z_x = _scores(Xa, nu, vec_dtype) if gam.any() else np.zeros(n_total)  # X ν(x_k)
    z_prev = z_x.copy()  # X ν(x_{k−1})

    f_old = _k.dual_objective(nu, gam, m, reg, loss)
    big_l = l_init
    l_next = l_init
    t_prev, t_cur = 0.0, 1.0
    gamma = np.nan
    gap = np.inf
    primal = np.inf
    converged = False
    n_iter = 0
    n_unshrink = 0
    while n_iter < max_iter:
        n_iter += 1
        n_act = rows.shape[0]
        gam_new, s, x0, grad = (b[:n_act] for b in (buf_new, buf_s, buf_x0, buf_grad))
        omega = max((t_prev - 1.0) / t_cur, 0.0)
        _k.search_point(gam, gam_prev, nu, nu_prev, omega, s, nu_s)
        z = z_x if omega == 0.0 else (1.0 + omega) * z_x - omega * z_prev  # X ν(s)
        big_l, gamma, dd, trials, curv = _k.line_search(
            *arrays, m, reg, loss, s, z, nu_s, l_next, gamma, gam_new, nu_new,
            grad, x0, work_a, work_c[: n_act - m], rng_state)
        l_next = max(L_SHRINK * big_l, curv)  # the next line search starts here
        gam_prev, gam = gam, gam_new.copy()
        nu_prev, nu, nu_new = nu, nu_new, nu_prev
        z_prev, z_x = z_x, _scores(Xa, nu, vec_dtype)
        t_prev, t_cur = t_cur, 0.5 * (1.0 + np.sqrt(1.0 + 4.0 * t_cur * t_cur))
        f_new = _k.dual_objective(nu, gam, m, reg, loss)
        if RESTART and f_new > f_old:
            t_prev, t_cur = 0.0, 1.0  # momentum reset (the objective went up)
        f_old = f_new
        primal = _k.primal_objective(z_x, nu, m, reg, loss)  # exact unless negatives are shrunk
        lower = -f_new / m  # D ≤ min P
        gap = (min(primal, p_zero) - lower) / lower if lower > 0.0 else np.inf
        zero_meets_rule = lower > 0.0 and p_zero - lower <= tol * lower  # exact: P(0) = ℓ(0)
        if verbose and (n_iter <= 5 or n_iter % 25 == 0):
            print(f"TopPush iter {n_iter:5d}  dual objective {f_new: .8e}  "
                  f"relative gap {gap:.2e}  L {big_l:.3e}  line-search trials {trials}  "
                  f"working negatives {n_act - m}")
        tau = -gamma * lm * big_l  # a negative with s_j = 0 gets β > 0 iff its score > τ

        if dd == 0.0 or gap <= tol:
            if n_act == n_total or zero_meets_rule:
                converged = True
                break
            # score the removed negatives once: does any of them want β > 0 or hold the top?
            removed = np.setdiff1d(np.arange(m, n_total), rows, assume_unique=True)
            z_removed = _scores(X, nu, vec_dtype)[removed]  # a full product copies nothing
            top_working = z_x[m:].max() if n_act > m else -np.inf
            back = (z_removed > tau) | (z_removed > top_working)
            if not back.any():
                converged = True
                break
            n_unshrink += 1
            if n_unshrink > UNSHRINK_PARTIAL:
                back[:] = True
                shrinking = False
            added = removed[back]
            if verbose:
                print(f"TopPush iter {n_iter:5d}  {added.size} removed negatives became active "
                      f"or top: back to {n_act - m + added.size} of {n_total - m} negatives"
                      + ("" if shrinking else ", shrinking off"))
            # removed coordinates are 0 in x_k and x_{k-1}: the momentum carries over as is
            gam, gam_prev = _expand(gam, rows, n_total), _expand(gam_prev, rows, n_total)
            z_full, z_prev_full = np.empty(n_total), np.empty(n_total)
            z_full[rows], z_full[added] = z_x, z_removed[back]
            z_prev_full[rows] = z_prev
            z_prev_full[added] = _scores(X[added], nu_prev, vec_dtype)
            z_check[added - m] = z_removed[back]
            rows = np.union1d(rows, added)
            gam, gam_prev, z_x, z_prev = gam[rows], gam_prev[rows], z_full[rows], z_prev_full[rows]
            Xa = X if rows.shape[0] == n_total else X[rows]
            arrays = _kernel_arrays(Xa)
            continue

        if shrinking and n_iter % SHRINK_EVERY == 0:
            neg = slice(m, n_act)
            z_neg = z_x[neg]
            idx = rows[neg] - m
            if n_iter >= 2 * SHRINK_EVERY:
                # remove if the score stays below τ even after twice its last change again
                moved = SHRINK_MARGIN * np.abs(z_neg - z_check[idx])
                drop = ((gam[neg] == 0.0) & (gam_prev[neg] == 0.0) & (z_neg + moved < tau))
                n_drop = int(drop.sum())
                if n_drop >= 0.1 * (n_act - m) and n_drop < n_act - m:
                    keep = np.r_[np.ones(m, bool), ~drop]
                    rows = rows[keep]
                    gam, gam_prev = gam[keep], gam_prev[keep]
                    z_x, z_prev = z_x[keep], z_prev[keep]
                    Xa = X[rows]
                    arrays = _kernel_arrays(Xa)
                    if verbose:
                        print(f"TopPush iter {n_iter:5d}  shrinking: {rows.shape[0] - m} of "
                              f"{n_total - m} negatives left")
            z_check[idx] = z_neg
    return (_expand(gam, rows, n_total), nu, n_iter, converged, gap, big_l, f_old, primal)


def _expand(gam, rows, n_total):
    """Working-problem duals back to all N rows (removed rows are 0)."""
    if rows.shape[0] == n_total:
        return gam
    full = np.zeros(n_total)
    full[rows] = gam
    return full


# --------------------------------------------------------------------------------------------
# the primal objective in numpy, and what eq. 6 can gain over w = 0
# --------------------------------------------------------------------------------------------


def loss_values(z, loss):
    """ℓ(z) elementwise, float64 (logistic without overflow; exponential may be inf)."""
    z = np.asarray(z, dtype=np.float64)
    if loss == _k.TRUNCATED_QUADRATIC:
        return np.maximum(1.0 + z, 0.0) ** 2
    if loss == _k.LOGISTIC:
        return np.logaddexp(0.0, z)
    with np.errstate(over="ignore"):
        return np.exp(z)


def loss_slopes(z, loss):
    """ℓ'(z) elementwise, float64 (the exponential's capped at e⁷⁰⁰ to stay finite)."""
    z = np.asarray(z, dtype=np.float64)
    if loss == _k.TRUNCATED_QUADRATIC:
        return 2.0 * np.maximum(1.0 + z, 0.0)
    if loss == _k.LOGISTIC:
        return 0.5 * (1.0 + np.tanh(0.5 * z))  # σ(z)
    return np.exp(np.minimum(z, 700.0))


def scores64(X, w, chunk=8192):
    """X w in float64 for a CSR or dense X of any float dtype (dense float32 X is converted a
    block of rows at a time, so no float64 copy of X is made)."""
    w = np.asarray(w, dtype=np.float64)
    if sp.issparse(X) or X.dtype == np.float64:
        return np.asarray(X @ w, dtype=np.float64).ravel()
    return np.concatenate([X[i:i + chunk].astype(np.float64) @ w
                           for i in range(0, X.shape[0], chunk)])


def primal_value(X, m, w, reg, loss):
    """P(w) of eq. 6, exactly, in float64; rows 0..m−1 of X positive, the rest negative::

        P(w) = λ/2 ‖w‖² + 1/m Σ_{i<m} ℓ(max_{j≥m} wᵀx_j − wᵀx_i)

    P(0) = ℓ(0) (``LOSS_AT_ZERO``). This is the number TopPush compares with P(0) and stores
    as ``objective_``; the solver's kernel computes the same value from ν = λm·w.
    """
    w = np.asarray(w, dtype=np.float64)
    s = scores64(X, w)
    return float(0.5 * reg * (w @ w) + loss_values(s[m:].max() - s[:m], loss).mean())


def _column_scale(X):
    """1/(max − min) of each column over all rows (1 where a column is constant)."""
    if sp.issparse(X):
        span = (X.max(axis=0).toarray() - X.min(axis=0).toarray()).ravel()
    else:
        span = X.max(axis=0) - X.min(axis=0)
    span = np.asarray(span, dtype=np.float64)
    return np.where(span > 0.0, 1.0 / np.where(span > 0.0, span, 1.0), 1.0)


def hull_projection(X, m, scale=None, beta0=None, max_iter=None):
    """Nearest point of the negatives' convex hull to the positives' mean (pairwise
    Frank-Wolfe, Lacoste-Julien & Jaggi 2015); rows 0..m−1 of X positive, the rest negative.

    Why: the subdifferential of eq. 6 at w = 0 is ℓ'(0)·(conv{x⁻_j} − x̄⁺) (λw vanishes there),
    so w = 0 is the optimum at every λ iff x̄⁺ lies in the hull, and otherwise the steepest
    descent direction of P at 0 is x̄⁺ − p, p the nearest hull point, with slope −ℓ'(0)·δ,
    δ = ‖x̄⁺ − p‖. Problem, in coordinates scaled by S = diag(``scale``) (default: 1/column
    range; the hull test is affine-invariant, the scaling only conditions the iterations)::

        min_{β ≥ 0, 1ᵀβ = 1}  f(β) = ½ ‖S (X⁻ᵀβ − x̄⁺)‖²

    from ``beta0`` (default: the vertex nearest to x̄⁺). Each step moves weight from the away
    vertex (largest gradient among β_j > 0) to the Frank-Wolfe vertex (smallest gradient) with
    an exact line search. The Frank-Wolfe gap G = Σ_j β_j ∇_j f − min_j ∇_j f bounds
    f − min f, so f − G > 0 certifies that x̄⁺ is outside the hull, and then
    u = −S²(X⁻ᵀβ − x̄⁺) separates: max_j uᵀx⁻_j < uᵀx̄⁺. Stops "inside" when
    √(2f) ≤ ``HULL_INSIDE`` · max_j ‖S x⁻_j‖, "outside" when f − G > 0 and
    G ≤ ``HULL_REL_GAP`` · f, "undecided" after ``max_iter`` (``HULL_MAX_ITER``) steps.

    Returns (β over the negatives, status, S, steps).
    """
    max_iter = HULL_MAX_ITER if max_iter is None else max_iter
    scale = _column_scale(X) if scale is None else np.asarray(scale, dtype=np.float64)
    target = np.asarray(X[:m].mean(axis=0), dtype=np.float64).ravel() * scale
    sparse = sp.issparse(X)
    if sparse:
        neg = (X[m:].astype(np.float64) @ sp.diags(scale)).tocsr()
        sq = np.asarray(neg.multiply(neg).sum(axis=1)).ravel()
    else:
        neg = np.asarray(X[m:], dtype=np.float64) * scale
        sq = np.einsum("ij,ij->i", neg, neg)
    n, d = neg.shape

    def row(j):
        if sparse:
            lo, hi = neg.indptr[j], neg.indptr[j + 1]
            return neg.indices[lo:hi], neg.data[lo:hi]
        return slice(None), neg[j]

    if beta0 is None:
        beta = np.zeros(n)
        beta[int(np.argmin(sq - 2.0 * np.asarray(neg @ target).ravel()))] = 1.0  # nearest
    else:
        beta = np.array(beta0, dtype=np.float64)
    r = np.asarray(neg.T @ beta).ravel() - target  # residual S(X⁻ᵀβ − x̄⁺)
    inside_at = HULL_INSIDE * np.sqrt(sq.max()) if n else 0.0
    buf = np.zeros(d)
    status, step = "undecided", 0
    for step in range(1, max_iter + 1):
        if step % 100 == 0:  # drop the round-off of the incremental updates
            r = np.asarray(neg.T @ beta).ravel() - target
        f = 0.5 * (r @ r)
        if np.sqrt(2.0 * f) <= inside_at:
            status = "inside"
            break
        grad = np.asarray(neg @ r).ravel()
        s = int(np.argmin(grad))
        active = np.flatnonzero(beta)
        a = int(active[np.argmax(grad[active])])
        fw_gap = beta[active] @ grad[active] - grad[s]
        if f - fw_gap > 0.0 and fw_gap <= HULL_REL_GAP * f:
            status = "outside"
            break
        if s == a or fw_gap <= 0.0:  # a minimizer: f = min f > inside_at²/2
            status = "outside"
            break
        idx_s, val_s = row(s)
        idx_a, val_a = row(a)
        buf[idx_s] = val_s
        cross = buf[idx_a] @ val_a
        buf[idx_s] = 0.0
        dist2 = sq[s] + sq[a] - 2.0 * cross
        if not dist2 > 0.0:
            break
        g = min((grad[a] - grad[s]) / dist2, beta[a])
        beta[s] += g
        beta[a] -= g
        r[idx_s] += g * val_s
        r[idx_a] -= g * val_a
    return beta, status, scale, step


def ray_minimum(c, sq_norm, reg, loss):
    """min_{t ≥ 0} h(t) = λ t² ‖u‖²/2 + 1/m Σ_i ℓ(t c_i): eq. 6 along the ray w = t u, with
    c_i = max_j uᵀx⁻_j − uᵀx⁺_i (for t > 0 the top negative does not depend on t).

    h is convex; h'(t) = λ t ‖u‖² + mean ℓ'(t c_i) c_i is non-decreasing, h'(0) = ℓ'(0)·mean c.
    If h'(0) ≥ 0, t = 0; else h'(T) > 0 is bracketed by doubling and the root found by
    bisection to relative width 1e-15. Returns (t, h(t)).
    """
    c = np.asarray(c, dtype=np.float64)
    value = float(loss_values(0.0, loss))

    def slope(t):
        return reg * t * sq_norm + float(np.mean(loss_slopes(t * c, loss) * c))

    if not slope(0.0) < 0.0 or not np.abs(c).max() > 0.0:
        return 0.0, value
    lo, hi = 0.0, 1.0 / np.abs(c).max()
    for _ in range(2100):
        if slope(hi) >= 0.0:
            break
        lo, hi = hi, 2.0 * hi
    for _ in range(200):
        mid = 0.5 * (lo + hi)
        if slope(mid) < 0.0:
            lo = mid
        else:
            hi = mid
        if hi - lo <= 1e-15 * hi:
            break
    t = 0.5 * (lo + hi)
    return t, float(0.5 * reg * t * t * sq_norm + loss_values(t * c, loss).mean())


def largest_reg_below(c, sq_norm, loss, level, extra_t=()):
    """The largest λ found for which some point t·u of the ray has eq. 6 below ``level``:

        λ(t) = 2 (level − mean ℓ(t c)) / (t² ‖u‖²),   maximized over t on a grid

    (481 log-spaced t across 12 decades around 1/max|c|, plus ``extra_t``). For every λ' ≤ the
    returned λ, min P ≤ P(t u) < ``level`` (certified by that point). 0.0 if no t qualifies.
    """
    c = np.asarray(c, dtype=np.float64)
    top = np.abs(c).max()
    if not top > 0.0 or not sq_norm > 0.0:
        return 0.0
    ts = np.r_[np.geomspace(1e-6, 1e6, 481) / top, [t for t in extra_t if t > 0.0]]
    best = 0.0
    for t in ts:
        lam = 2.0 * (level - loss_values(t * c, loss).mean()) / (t * t * sq_norm)
        best = max(best, lam)
    return float(best)


def zero_analysis(X, m, reg, loss, tol):
    """What eq. 6 can gain over w = 0, at this λ and at any other (rows 0..m−1 positive).

    With β from :func:`hull_projection` (column-scaled; unless that finds x̄⁺ inside the hull,
    continued in the original coordinates, those of eq. 6) and r = X⁻ᵀβ − x̄⁺, δ̂ = ‖r‖ ≥ δ.
    The dual point α = ℓ'(0)·1, β' = ℓ'(0)·m·β is feasible for (7) at every λ' and gives
    (with ℓ*(ℓ'(0)) = −ℓ(0))

        min P(λ') ≥ ℓ(0) − ℓ'(0)² δ̂² / (2λ'),

    so w = 0 meets the stopping rule at every λ' ≥ ``reg_no`` = ℓ'(0)² δ̂² (1 + tol) /
    (2 ℓ(0) tol) (at exact convergence; λ' this large is degenerate). Conversely each candidate
    direction u (u = −S²r with the scaling S of the last Frank-Wolfe run, and u = −r)
    that separates x̄⁺ from the negatives (max_j uᵀx⁻_j < uᵀx̄⁺, i.e. P decreases from 0 along
    it) gives ``reg_yes``: below it a point t·u has P < ℓ(0)/(1 + tol), so w = 0 no longer
    meets the rule (:func:`largest_reg_below`). The best separating direction at ``reg`` is
    returned with its ray minimum (:func:`ray_minimum`).

    Returns a dict: status ("inside", "outside", "undecided"), delta (δ̂), reg_no, reg_yes
    (0.0 if none), direction (u or None), t and value (of the ray minimum at ``reg``;
    value = ℓ(0) when no direction separates), steps (Frank-Wolfe steps), beta (β).
    """
    beta, status, scale, steps = hull_projection(X, m)
    if status != "inside":  # refine in the coordinates of eq. 6 (its steepest descent, its δ)
        beta, status_orig, _, more = hull_projection(X, m, scale=np.ones(X.shape[1]),
                                                     beta0=beta)
        steps += more
        status = status_orig if status == "undecided" else status
        scale = np.ones(X.shape[1])
    mean_pos = np.asarray(X[:m].mean(axis=0), dtype=np.float64).ravel()
    r = np.asarray(X[m:].T @ beta, dtype=np.float64).ravel() - mean_pos
    delta = float(np.sqrt(r @ r))
    p_zero = float(loss_values(0.0, loss))
    slope0 = SLOPE_AT_ZERO[loss]
    if delta == 0.0:
        reg_no = 0.0
    elif tol > 0.0:
        reg_no = slope0 ** 2 * delta ** 2 * (1.0 + tol) / (2.0 * p_zero * tol)
    else:
        reg_no = np.inf
    out = {"status": status, "delta": delta, "reg_no": float(reg_no), "reg_yes": 0.0,
           "direction": None, "t": 0.0, "value": p_zero, "steps": steps, "beta": beta}
    level = p_zero / (1.0 + tol)
    directions = [-r] if np.all(scale == 1.0) else [-(scale * scale) * r, -r]
    for u in directions:
        s = scores64(X, u)
        c = s[m:].max() - s[:m]
        if not c.mean() < 0.0:  # P does not decrease from 0 along u
            continue
        sq_norm = float(u @ u)
        t, value = ray_minimum(c, sq_norm, reg, loss)
        out["reg_yes"] = max(out["reg_yes"],
                             largest_reg_below(c, sq_norm, loss, level, extra_t=(t,)))
        if value < out["value"]:
            out.update(direction=u, t=t, value=value)
    return out


def hull_duals(X, m, beta_hull, reg, loss):
    """The dual point of the hull projection: α = ℓ'(0)·1, β = ℓ'(0)·m·β_hull (feasible for
    (7): 1ᵀα = 1ᵀβ = ℓ'(0)·m; ℓ'(0) ≤ 1 for the logistic loss) and its g (7), evaluated
    exactly from ν = αᵀX⁺ − βᵀX⁻. At a δ̂ of nearly 0 this is about −m·ℓ(0), i.e. it certifies
    that w = 0 is optimal. Returns (γ = [α; β], g)."""
    slope0 = SLOPE_AT_ZERO[loss]
    gam = np.r_[np.full(m, slope0), slope0 * m * np.asarray(beta_hull, dtype=np.float64)]
    signs = np.r_[np.ones(m), -np.ones(gam.size - m)]
    nu = np.asarray(X.T @ (signs * gam), dtype=np.float64).ravel()
    conj = m * _k.conj_value(slope0, loss)
    return gam, float(nu @ nu / (2.0 * reg * m) + conj)
