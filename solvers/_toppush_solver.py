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
# P(0) = ℓ(0), eq. 6 at w = 0 (TopPush warns when w = 0 itself meets the stopping rule)
LOSS_AT_ZERO = {"truncated_quadratic": 1.0, "logistic": float(np.log(2.0)), "exponential": 1.0}
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


def solve(X, m, gam, reg, loss, tol, max_iter, l_init, rng_state, verbose):
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

    Stopping rule: the relative duality gap at the iterate x_{k+1}. Every feasible (α, β)
    gives a lower bound D = −g(α, β)/m on min P and every w an upper bound P(w); with w from
    (9) of the same iterate, stop after the first iteration with

        P(w) − D(α, β) ≤ tol · D(α, β)          (min P > 0 for all three losses)

    (or when the accepted step is exactly zero: s is then a fixed point of the projected
    gradient map, hence optimal). Both sides depend only on the iterate, not on where the
    iterations started, so a warm start near the optimum stops at once and a warm start far
    from it does not stop early; on return P(coef_) ≤ (1 + tol) · D ≤ (1 + tol) · min P,
    i.e. P(coef_)/min P − 1 ≤ tol, the suboptimality the benchmark measures. P needs the
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
    g and P at the returned iterate, so −g/m ≤ min P ≤ P(w) (P exact over all negatives when
    converged).
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
        gap = (primal - lower) / lower if lower > 0.0 else np.inf
        if verbose and (n_iter <= 5 or n_iter % 25 == 0):
            print(f"TopPush iter {n_iter:5d}  dual objective {f_new: .8e}  "
                  f"relative gap {gap:.2e}  L {big_l:.3e}  line-search trials {trials}  "
                  f"working negatives {n_act - m}")
        tau = -gamma * lm * big_l  # a negative with s_j = 0 gets β > 0 iff its score > τ

        if dd == 0.0 or gap <= tol:
            if n_act == n_total:
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
