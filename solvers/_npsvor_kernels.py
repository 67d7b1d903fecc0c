"""Numba kernels for linear NPSVOR (Shi, Wang, Shen, Niu, "A Novel Large-scale Ordinal Regression
Model"). Plain arrays only: no validation, no Python objects; the estimator in
``solvers/npsvor.py`` checks inputs, dispatches and runs the p rank problems in threads.

Storage. The n training rows are either CSR arrays (``data, indices, indptr``; indices sorted
within a row, no duplicates) or a dense C-contiguous (n, m) ``data`` array, in which case
``indices`` and ``indptr`` are unused (pass empty arrays). The two row operations (dot product
with w, w += a·x_i) are overloaded on the storage, so every kernel below is written once. A
constant feature of value ``bias`` is appended to every row without copying X: its weight is
the scalar ``wb``, the intercept is ``wb·bias``, and ``bias = 0`` means no intercept.

The solver of one rank is :func:`solve_rank` (Algorithm 2, DCD-2); its docstring states the
problem, the coordinate step, the stopping rule and shrinking. The estimator runs the p ranks
in parallel threads (these kernels release the GIL). :func:`rank_new`/:func:`rank_old` are the
predictors of eqs. 36 and 3, :func:`score_new`/:func:`score_old` their continuous versions.
"""

from __future__ import annotations

import numpy as np
from numba import njit, types
from numba.extending import overload

from solvers._random import next_u64

# --------------------------------------------------------------------------------------------
# row operations, overloaded on the storage (CSR arrays or a dense 2-D array)
# --------------------------------------------------------------------------------------------


def row_dot(data, indices, indptr, i, w):
    """x_iᵀw (Python stub; the jitted versions are the overloads below)."""
    raise NotImplementedError


def row_axpy(data, indices, indptr, i, a, w):
    """w += a·x_i (Python stub)."""
    raise NotImplementedError


def row_sq_norm(data, indices, indptr, i):
    """‖x_i‖² (Python stub)."""
    raise NotImplementedError


def _dense(data):
    return isinstance(data, types.Array) and data.ndim == 2


@overload(row_dot)
def _row_dot(data, indices, indptr, i, w):
    if _dense(data):
        def dense(data, indices, indptr, i, w):
            s = 0.0
            for j in range(data.shape[1]):
                s += data[i, j] * w[j]
            return s
        return dense

    def sparse(data, indices, indptr, i, w):
        s = 0.0
        for p in range(indptr[i], indptr[i + 1]):
            s += data[p] * w[indices[p]]
        return s
    return sparse


@overload(row_axpy)
def _row_axpy(data, indices, indptr, i, a, w):
    if _dense(data):
        def dense(data, indices, indptr, i, a, w):
            for j in range(data.shape[1]):
                w[j] += a * data[i, j]
        return dense

    def sparse(data, indices, indptr, i, a, w):
        for p in range(indptr[i], indptr[i + 1]):
            w[indices[p]] += a * data[p]
    return sparse


@overload(row_sq_norm)
def _row_sq_norm(data, indices, indptr, i):
    if _dense(data):
        def dense(data, indices, indptr, i):
            s = 0.0
            for j in range(data.shape[1]):
                v = np.float64(data[i, j])
                s += v * v
            return s
        return dense

    def sparse(data, indices, indptr, i):
        s = 0.0
        for p in range(indptr[i], indptr[i + 1]):
            v = np.float64(data[p])
            s += v * v
        return s
    return sparse


@njit(cache=True, nogil=True)
def row_sq_norms(data, indices, indptr, n_rows, out):
    """out[i] = ‖x_i‖² for every row (the diagonal A_i of the dual, without the bias term)."""
    for i in range(n_rows):
        out[i] = row_sq_norm(data, indices, indptr, i)


# --------------------------------------------------------------------------------------------
# one coordinate: step (22)/(26-27) and optimality violation (24)/(30)
# --------------------------------------------------------------------------------------------


@njit(cache=True, nogil=True)
def coordinate_step(alpha_i, B, A, in_rank, C1, C2, eps):
    """Exact minimiser over s of the dual restricted to α_i = s (eqs. 21-22 and 25-27).

    ``B`` = ỹ_i f(x_i) at the current w, ``A`` = A_i ≥ 0, ``in_rank``: y_i = k.
    """
    if in_rank:
        Gp = B + eps
        Gn = B - eps
        if A <= 0.0:
            return 0.0
        if Gp < A * alpha_i:
            d = -Gp / A
        elif Gn > A * alpha_i:
            d = -Gn / A
        else:
            d = -alpha_i
        return min(max(alpha_i + d, -C1), C1)
    if A <= 0.0:
        return C2
    return min(max(alpha_i - (B - 1.0) / A, 0.0), C2)


@njit(cache=True, nogil=True)
def violation(alpha_i, B, in_rank, C1, C2, eps):
    """|v_i|: the projected gradient (24) for i ∉ I, (30) for i ∈ I; zero iff α_i is optimal
    along its coordinate."""
    if in_rank:
        Gp = B + eps
        Gn = B - eps
        if alpha_i == 0.0:
            if Gp < 0.0:
                return -Gp
            if Gn > 0.0:
                return Gn
            return 0.0
        if alpha_i >= C1:
            return max(Gp, 0.0)
        if alpha_i <= -C1:
            return max(-Gn, 0.0)
        return abs(Gp) if alpha_i > 0.0 else abs(Gn)
    G = B - 1.0
    if alpha_i <= 0.0:
        return max(-G, 0.0)
    if alpha_i >= C2:
        return max(G, 0.0)
    return abs(G)


@njit(cache=True, nogil=True)
def _shrinkable(alpha_i, B, in_rank, C1, C2, eps, M):
    """Conditions (32)/(33): α_i sits at a bound and its gradient points outward by more than
    the previous pass's largest violation M."""
    if in_rank:
        Gp = B + eps
        Gn = B - eps
        if alpha_i == 0.0:
            return Gp > M and Gn < -M
        if alpha_i >= C1:
            return Gp < -M
        if alpha_i <= -C1:
            return Gn > M
        return False
    G = B - 1.0
    if alpha_i <= 0.0:
        return G > M
    if alpha_i >= C2:
        return G < -M
    return False


@njit(cache=True, nogil=True)
def _rand_below(state, k):
    """Next splitmix64 output reduced to [0, k); advances ``state[0]``."""
    state[0], z = next_u64(state[0])
    return np.int64(z % np.uint64(k))


# --------------------------------------------------------------------------------------------
# the solver of one rank: Algorithm 2 (DCD-2)
# --------------------------------------------------------------------------------------------


@njit(cache=True, nogil=True)
def build_w(data, indices, indptr, y_rank, k, bias, alpha, w):
    """w = Σ_i ỹ_i α_i x_i (eq. 19) into ``w`` (zeroed first); returns the bias weight wb.
    LIBLINEAR's setup loop: exact for any α, so a warm start resumes where it left off."""
    for j in range(w.shape[0]):
        w[j] = 0.0
    wb = 0.0
    for i in range(y_rank.shape[0]):
        a = alpha[i]
        if a != 0.0:
            if y_rank[i] <= k:
                a = -a
            row_axpy(data, indices, indptr, i, a, w)
            wb += a * bias
    return wb


@njit(cache=True, nogil=True)
def solve_rank(data, indices, indptr, sq_norms, y_rank, k, bias, C1, C2, eps, squared, tol,
               max_iter, shrinking, seed, alpha, w):
    """Dual coordinate descent (Algorithm 2, DCD-2) on problem (20) of rank ``k``.

    Problem of rank k (paper eqs. 2/4; ranks are coded 0..p−1, ``y_rank[i]`` is row i's rank).
    With I = {i : y_i = k}, ỹ_i = +1 if y_i > k and −1 if y_i ≤ k, f(x) = wᵀx (+ wb·bias):

        primal  min_w  ½‖w‖² + C1 Σ_{i∈I} max(|f(x_i)| − ε, 0)
                             + C2 Σ_{i∉I} max(1 − ỹ_i f(x_i), 0)                          (4)

        dual    min_α  D(α) = ½‖w(α)‖² + ε Σ_{i∈I} |α_i| − Σ_{i∉I} α_i                       (20)
                s.t.   −C1 ≤ α_i ≤ C1 (i ∈ I),   0 ≤ α_i ≤ C2 (i ∉ I),
                w(α) = Σ_i ỹ_i α_i x_i                                                     (19)

    α_i for i ∈ I is the merged variable α⁺_i − α⁻_i of the dual (6) (at the optimum one of the
    two is zero, section 3.1.2). Strong duality: min (4) = −min (20), and P(w(α)) + D(α) ≥ 0 is
    the duality gap. (The bias weight is part of w and regularised, as LIBLINEAR's ``-B``.)

    Coordinate step. With A_i = ‖x_i‖² (+ bias²) and B_i = ỹ_i f(x_i) at the current w, the
    dual restricted to α_i = s is, up to a constant,

        i ∉ I:  h(s) = ½A_i(s − α_i)² + (B_i − 1)s           on [0, C2]                     (21)
                α_i ← min(max(α_i − (B_i − 1)/A_i, 0), C2)                                    (22)
        i ∈ I:  g(s) = ½A_i(s − α_i)² + B_i s + ε|s|          on [−C1, C1]                   (25)
                with G⁺ = B_i + ε, G⁻ = B_i − ε:
                d = −G⁺/A_i if G⁺ < A_iα_i;  −G⁻/A_i if G⁻ > A_iα_i;  −α_i otherwise          (27)
                α_i ← min(max(α_i + d, −C1), C1)                                              (26)

    and w ← w + (α_i^new − α_i^old) ỹ_i x_i (29). A_i = 0 (an empty row without bias) leaves w
    unchanged, so the step is the minimiser of the linear part: C2 for i ∉ I, 0 for i ∈ I.

    Squared losses (``squared``; the "square hinge loss (L2 loss)" of the paper's conclusion,
    the authors' LinearNPSVOR ``-m 2``): the primal's losses are squared,

        min_w  ½‖w‖² + C1 Σ_{i∈I} max(|f(x_i)| − ε, 0)² + C2 Σ_{i∉I} max(1 − ỹ_i f(x_i), 0)²

    and its dual is (20) plus Σ_i α_i²/(4C_i) with the upper bounds gone: α_i ∈ ℝ (i ∈ I),
    α_i ≥ 0 (i ∉ I), as LIBLINEAR's L2-loss SVC dual. A coordinate sees the same one-variable
    problem with A_i + D_i for A_i, B_i + D_i α_i for B_i and infinite bounds, D_i = 1/(2C_i):
    the steps, violations and shrinking below serve both losses.

    Optimality measure: |v_i| with v_i the projected gradient (24) for i ∉ I and (30) for i ∈ I;
    α is optimal iff v = 0.

    Stopping rule (eq. 31), measured against the point α = 0 (w = 0), never a warm start:

        ‖v^t‖₁ ≤ tol · ‖v(0)‖₁,   ‖v(0)‖₁ = |{i ∉ I}|,

    because at α = 0 every i ∉ I has v_i = B_i − 1 = −1 and every i ∈ I has v_i = 0
    (|B_i| = 0 ≤ ε). ‖v^t‖₁ sums |v_i| over the coordinates visited in pass t, each taken just
    before its update. So a good warm start stops after one pass and a bad one is not held to
    its own (large) starting violation. ``tol`` = 0.1 is the paper's setting (an average
    violation of at most 0.1 per non-rank instance). (The authors' code measures against its
    own first pass, which is already small after a good warm start: it would then run on.)

    Shrinking (eqs. 32-34; M = max_i |v_i| of the previous pass, ∞ in the first pass and after
    an un-shrink): a coordinate leaves the active set if

        i ∉ I:  α_i = 0 and G > M,  or  α_i = C2 and G < −M                               (32)
        i ∈ I:  α_i = 0, G⁻ < −M and G⁺ > M;  α_i = C1, G⁺ < −M;  α_i = −C1, G⁻ > M        (33)

    with G = B_i − 1. When the rule holds on the active set only, every coordinate comes back,
    M = ∞, and the solver stops only once the rule holds on a pass over all n coordinates
    (LIBLINEAR's un-shrink pass). The active set is visited in a fresh random order every pass,
    drawn from a splitmix64 stream seeded by ``seed``: a rank's result depends only on its
    inputs (not on threads).

    Arguments: ``alpha`` (n,) is the starting point, inside the box (the caller clips a warm
    start), and is overwritten with the solution; ``w`` (m,) receives w(α) (rebuilt from
    ``alpha`` first). ``sq_norms`` holds ‖x_i‖² without the bias; ``bias`` is the appended
    feature's value (0: none). At most ``max_iter`` passes (an un-shrink pass counts as one).

    Returns ``(n_iter, wb, ratio, converged)``: passes made, the bias weight, the last pass's
    ‖v‖₁ / ‖v(0)‖₁ (over the coordinates it visited), and whether the rule held on a pass
    over all coordinates.
    """
    n = y_rank.shape[0]
    wb = build_w(data, indices, indptr, y_rank, k, bias, alpha, w)
    bias2 = bias * bias
    # bounds U and diagonal D of the dual, rank's own rows (1) and the others (2)
    U1, U2, D1, D2 = C1, C2, 0.0, 0.0
    if squared:
        U1, U2, D1, D2 = np.inf, np.inf, 0.5 / C1, 0.5 / C2
    reference = 0.0
    for i in range(n):
        if y_rank[i] != k:
            reference += 1.0
    threshold = tol * reference
    index = np.arange(n)
    state = np.empty(1, np.uint64)
    state[0] = seed
    active = n
    M = np.inf
    ratio = np.inf
    converged = False
    n_iter = 0
    while n_iter < max_iter:
        for s in range(active - 1):
            j = s + _rand_below(state, active - s)
            t = index[s]
            index[s] = index[j]
            index[j] = t
        gnorm1 = 0.0
        gmax = 0.0
        s = 0
        while s < active:
            i = index[s]
            in_rank = y_rank[i] == k
            sign = 1.0 if y_rank[i] > k else -1.0
            a = alpha[i]
            D = D1 if in_rank else D2
            B = sign * (row_dot(data, indices, indptr, i, w) + wb * bias) + D * a
            if shrinking and _shrinkable(a, B, in_rank, U1, U2, eps, M):
                active -= 1
                index[s] = index[active]
                index[active] = i
                continue
            v = violation(a, B, in_rank, U1, U2, eps)
            gnorm1 += v
            if v > gmax:
                gmax = v
            if v > 1e-12:
                a_new = coordinate_step(a, B, sq_norms[i] + bias2 + D, in_rank, U1, U2, eps)
                d = (a_new - a) * sign
                if d != 0.0:
                    alpha[i] = a_new
                    row_axpy(data, indices, indptr, i, d, w)
                    wb += d * bias
            s += 1
        n_iter += 1
        ratio = gnorm1 / reference if reference > 0.0 else 0.0
        if gnorm1 <= threshold:
            if active == n:
                converged = True
                break
            active = n
            M = np.inf
            continue
        M = gmax
    return n_iter, wb, ratio, converged


# --------------------------------------------------------------------------------------------
# prediction helpers on the (n, p) hyperplane values
# --------------------------------------------------------------------------------------------


@njit(cache=True, nogil=True)
def rank_new(F, out):
    """r_new (eq. 36): out[i] = #{k < p−1 : F[i, k] + F[i, k+1] > 0}, a rank index 0..p−1."""
    n, p = F.shape
    for i in range(n):
        c = 0
        for k in range(p - 1):
            if F[i, k] + F[i, k + 1] > 0.0:
                c += 1
        out[i] = c


@njit(cache=True, nogil=True)
def rank_old(F, out):
    """r_old (eq. 3): out[i] = argmin_k |F[i, k]| (the first one on ties), a rank index."""
    n, p = F.shape
    for i in range(n):
        best = 0
        dist = abs(F[i, 0])
        for k in range(1, p):
            if abs(F[i, k]) < dist:
                dist = abs(F[i, k])
                best = k
        out[i] = best


# --------------------------------------------------------------------------------------------
# continuous rank scores (NPSVOR.predict_score), consistent with rank_new / rank_old
# --------------------------------------------------------------------------------------------


@njit(cache=True, nogil=True)
def score_new(F, out):
    """r_new made continuous: out[i] = c + u − ½ ∈ [c − ½, c + ½], c the r_new rank index.

    With g_k = F[i, k] + F[i, k+1] (the p − 1 ordered binary decisions of eq. 35) sorted
    decreasingly, g_(1) ≥ … ≥ g_(p−1), r_new counts the c positive ones, and u ∈ [0, 1] is the
    position between the two decisions that bracket 0:
        0 < c < p−1:  u = g_(c) / (g_(c) − g_(c+1))   (linear between the boundaries),
        c = 0:        u = 2σ(g_(1))                   (σ the logistic function),
        c = p−1:      u = tanh(g_(p−1) / 2).
    The score is continuous in F (at a boundary both sides give c + ½) and orders rows as
    r_new does: a row with a higher r_new never scores lower.
    """
    n, p = F.shape
    g = np.empty(p - 1)
    for i in range(n):
        for k in range(p - 1):
            g[k] = F[i, k] + F[i, k + 1]
        # insertion sort, decreasing (p is small)
        for a in range(1, p - 1):
            v = g[a]
            b = a - 1
            while b >= 0 and g[b] < v:
                g[b + 1] = g[b]
                b -= 1
            g[b + 1] = v
        c = 0
        for k in range(p - 1):
            if g[k] > 0.0:
                c += 1
        if c == 0:
            u = 2.0 / (1.0 + np.exp(-g[0]))
        elif c == p - 1:
            u = np.tanh(0.5 * g[p - 2])
        else:
            u = g[c - 1] / (g[c - 1] - g[c])
        out[i] = c - 0.5 + u


@njit(cache=True, nogil=True)
def score_old(F, out):
    """r_old made continuous: out[i] = r + ½·(a − b)/(a + b) ∈ (r − ½, r + ½], r the r_old
    rank index, with d_k = |F[i, k]|, a = d_{r−1} − d_r and b = d_{r+1} − d_r the margins by
    which the neighbouring ranks lose (a = 1, resp. b = 1, at the lowest, resp. highest, rank).
    At a tie with the rank above (b = 0) the score is r + ½, where that rank's score starts
    (a = 0 there), so adjacent ranks join continuously and a row with a higher r_old never
    scores lower.
    """
    n, p = F.shape
    for i in range(n):
        r = 0
        dr = abs(F[i, 0])
        for k in range(1, p):
            if abs(F[i, k]) < dr:
                dr = abs(F[i, k])
                r = k
        a = abs(F[i, r - 1]) - dr if r > 0 else 1.0
        b = abs(F[i, r + 1]) - dr if r < p - 1 else 1.0
        out[i] = r + (0.5 * (a - b) / (a + b) if a + b > 0.0 else 0.0)
