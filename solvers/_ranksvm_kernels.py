"""Numba kernels for kernel RankSVM (Kuo, Lee, Lin, "Large-scale Kernel RankSVM", SDM 2014).
Plain arrays only: no validation, no Python objects; ``solvers/kernel_ranksvm.py`` validates,
``solvers/_gram.py`` blocks the kernel matrix and ``solvers/_ranksvm_tron.py`` /
``solvers/_ranksvm_frank_wolfe.py`` drive the iterations.

Layout shared by every kernel below. The l training instances that take part in at least one
preference pair are stored query by query: query q owns the rows ``qptr[q]:qptr[q+1]``.
``level[i]`` is the relevance of row i as a dense rank inside its query (0 = least relevant,
levels 0..k_q−1), so the preference pairs of the paper's (1.1) are

    P = {(i, j) : q_i = q_j, level_i > level_j}        ((i, j): i should score above j)

With scores f (f = Qβ in the l-variable problem) the margin of a pair is

    z_ij = 1 − f_i + f_j                              (a pair "violates" when z_ij > 0)

Pair sums (the paper's (3.17)-(3.18) and the γ± of Appendix B, generalised to a band of
margins). For thresholds τ₁ < τ₂ (τ₂ may be +inf) and any values u (columns of U):

    cnt_lo[i] = |{j : (i, j) ∈ P, τ₁ < z_ij ≤ τ₂}|          sum_lo[i] = Σ over them of u_j
    cnt_hi[i] = |{j : (j, i) ∈ P, τ₁ < z_ji ≤ τ₂}|          sum_hi[i] = Σ over them of u_j

With (τ₁, τ₂) = (0, +inf): cnt_lo = l⁻(β), cnt_hi = l⁺(β) of (3.17)-(3.18), and with u = Qv the
sums are γ⁻(β, v), γ⁺(β, v). They are computed without visiting the pairs: one sort of each
query's scores (:func:`argsort_segments`), then two sweeps per query (one in decreasing, one in
increasing score) that insert rows into a Fenwick tree indexed by level once their score
crosses the threshold; a row's sums are a prefix (lower levels) or suffix (higher levels) query
of the tree. Cost O(l_q log k_q) per query after the sort, so O(l log l) in all. The pair test
is evaluated in one form only, ``f_lower > f_upper − 1 + τ``, from both sides of a pair, so a
pair is counted by both of its rows or by neither (the generalized Hessian stays symmetric).

The kernel-matrix transforms (:func:`rbf_from_dot_f32` etc.) turn a block of inner products
into kernel values in place; the float32 RBF uses its own vectorisable exp (relative error
below 1e-7, float32 round-off) because numba's scalar ``exp`` is about 4x slower here.
"""

from __future__ import annotations

import math

import numpy as np
from numba import njit, prange

# --------------------------------------------------------------------------------------------
# sorting and pair sums
# --------------------------------------------------------------------------------------------


@njit(cache=True)
def _argsort_queries(q0, q1, f, qptr, order):
    for q in range(q0, q1):
        a = qptr[q]
        b = qptr[q + 1]
        local = np.argsort(f[a:b], kind="mergesort")
        for t in range(b - a):
            order[a + t] = a + local[t]


@njit(cache=True)
def argsort_segments(f, qptr, order):
    """``order[qptr[q]:qptr[q+1]]`` = the rows of query q sorted by increasing ``f``."""
    _argsort_queries(0, qptr.shape[0] - 1, f, qptr, order)


@njit(parallel=True, cache=True)
def argsort_segments_parallel(f, qptr, order, n_chunks):
    """:func:`argsort_segments` with the queries split into ``n_chunks`` parallel chunks."""
    nq = qptr.shape[0] - 1
    for c in prange(n_chunks):
        _argsort_queries(c * nq // n_chunks, (c + 1) * nq // n_chunks, f, qptr, order)


@njit(cache=True)
def _tree_add(tree_c, tree_s, pos, w, U, j):
    """Fenwick tree over levels: add weight ``w`` (count) and ``w * U[j]`` (sums) at ``pos``."""
    m = U.shape[1]
    i = pos + 1
    while i < tree_c.shape[0]:
        tree_c[i] += w
        for c in range(m):
            tree_s[i, c] += w * U[j, c]
        i += i & (-i)


@njit(cache=True)
def _tree_prefix(tree_c, tree_s, pos, out_s, row):
    """Count and sums over levels 0..pos−1; the sums go to ``out_s[row]``, the count is
    returned."""
    m = tree_s.shape[1]
    cnt = 0.0
    for c in range(m):
        out_s[row, c] = 0.0
    i = pos
    while i > 0:
        cnt += tree_c[i]
        for c in range(m):
            out_s[row, c] += tree_s[i, c]
        i -= i & (-i)
    return cnt


@njit(cache=True)
def _pair_sums_queries(q0, q1, f, order, qptr, level, tau_lo, tau_hi, U, cnt_lo, sum_lo,
                       cnt_hi, sum_hi):
    """:func:`pair_sums` for the queries q0..q1−1."""
    m = U.shape[1]
    kmax = 0
    for t in range(qptr[q0], qptr[q1]):
        kmax = max(kmax, level[t] + 1)
    tree_c = np.zeros(kmax + 1)
    tree_s = np.zeros((kmax + 1, m))
    total_s = np.zeros(m)
    for q in range(q0, q1):
        a = qptr[q]
        b = qptr[q + 1]
        k = 0
        for t in range(a, b):
            k = max(k, level[t] + 1)
        tc = tree_c[:k + 1]
        ts = tree_s[:k + 1]
        tc[:] = 0.0
        ts[:, :] = 0.0
        # rows i as the preferred end of a pair: partners j of lower level whose score
        # exceeds f_i − 1 + τ₁ (minus those above f_i − 1 + τ₂); i in decreasing score.
        p_in = b - 1
        p_out = b - 1
        for t in range(b - 1, a - 1, -1):
            i = order[t]
            thr_in = f[i] - 1.0 + tau_lo
            thr_out = f[i] - 1.0 + tau_hi
            while p_in >= a and f[order[p_in]] > thr_in:
                j = order[p_in]
                _tree_add(tc, ts, level[j], 1.0, U, j)
                p_in -= 1
            while p_out >= a and f[order[p_out]] > thr_out:
                j = order[p_out]
                _tree_add(tc, ts, level[j], -1.0, U, j)
                p_out -= 1
            cnt_lo[i] = _tree_prefix(tc, ts, level[i], sum_lo, i)
        tc[:] = 0.0
        ts[:, :] = 0.0
        # rows i as the less relevant end: partners j of higher level with
        # f_i > f_j − 1 + τ₁ (and not f_i > f_j − 1 + τ₂); i in increasing score, so the
        # partners enter in increasing f_j − 1 + τ, the same test as above seen from i.
        p_in = a
        p_out = a
        total_c = 0.0
        total_s[:] = 0.0
        for t in range(a, b):
            i = order[t]
            while p_in < b and f[i] > f[order[p_in]] - 1.0 + tau_lo:
                j = order[p_in]
                _tree_add(tc, ts, level[j], 1.0, U, j)
                total_c += 1.0
                for c in range(m):
                    total_s[c] += U[j, c]
                p_in += 1
            while p_out < b and f[i] > f[order[p_out]] - 1.0 + tau_hi:
                j = order[p_out]
                _tree_add(tc, ts, level[j], -1.0, U, j)
                total_c -= 1.0
                for c in range(m):
                    total_s[c] -= U[j, c]
                p_out += 1
            below = _tree_prefix(tc, ts, level[i] + 1, sum_hi, i)
            cnt_hi[i] = total_c - below
            for c in range(m):
                sum_hi[i, c] = total_s[c] - sum_hi[i, c]


@njit(cache=True)
def pair_sums(f, order, qptr, level, tau_lo, tau_hi, U, cnt_lo, sum_lo, cnt_hi, sum_hi):
    """Band pair sums of the module docstring for the band τ₁ = ``tau_lo`` < z ≤ ``tau_hi``.

    ``order`` comes from :func:`argsort_segments` on the same ``f``. ``U`` is (l, m);
    ``sum_lo`` and ``sum_hi`` are (l, m) outputs, ``cnt_lo`` and ``cnt_hi`` (l,) outputs
    (float64: they enter products with scores). ``tau_hi`` may be ``np.inf``.
    """
    _pair_sums_queries(0, qptr.shape[0] - 1, f, order, qptr, level, tau_lo, tau_hi, U,
                       cnt_lo, sum_lo, cnt_hi, sum_hi)


@njit(parallel=True, cache=True)
def pair_sums_parallel(f, order, qptr, level, tau_lo, tau_hi, U, cnt_lo, sum_lo, cnt_hi,
                       sum_hi, n_chunks):
    """:func:`pair_sums` with the queries split into ``n_chunks`` parallel chunks (worth it
    from about 10⁵ rows; below, the threads' start-up costs more than the sums)."""
    nq = qptr.shape[0] - 1
    for c in prange(n_chunks):
        _pair_sums_queries(c * nq // n_chunks, (c + 1) * nq // n_chunks, f, order, qptr,
                           level, tau_lo, tau_hi, U, cnt_lo, sum_lo, cnt_hi, sum_hi)


@njit(cache=True)
def pair_counts_total(qptr, level):
    """Number of preference pairs of each query (|P| restricted to the query), exactly."""
    nq = qptr.shape[0] - 1
    out = np.zeros(nq, dtype=np.int64)
    for q in range(nq):
        a = qptr[q]
        b = qptr[q + 1]
        k = 0
        for t in range(a, b):
            k = max(k, level[t] + 1)
        hist = np.zeros(k, dtype=np.int64)
        for t in range(a, b):
            hist[level[t]] += 1
        below = 0
        total = 0
        for v in range(k):
            total += hist[v] * below
            below += hist[v]
        out[q] = total
    return out


# --------------------------------------------------------------------------------------------
# kernel values from inner products (in place)
# --------------------------------------------------------------------------------------------

# 2^x on [0, 1): degree-5 fit of the relative error (max 7.7e-8, float32 round-off)
_P0 = np.float32(0.9999999269249829)
_P1 = np.float32(0.6931529681766321)
_P2 = np.float32(0.2401545298867202)
_P3 = np.float32(0.05582360446229856)
_P4 = np.float32(0.008992584031321)
_P5 = np.float32(0.0018762329451965931)
_LOG2E = np.float32(1.4426950408889634)


@njit(parallel=True, fastmath=True, cache=True)
def rbf_from_dot_f32(G, sq_rows, sq_cols, gamma):
    """G[i, j] ← exp(−γ max(0, ‖a_i‖² + ‖b_j‖² − 2 G[i, j])) for a float32 block G = A Bᵀ.

    exp(x) = 2^k · 2^r with k = ⌊x log₂e⌋, r ∈ [0, 1): 2^r by a polynomial and 2^k by writing
    the exponent bits, both vectorisable (x is clamped at 2^−126, the smallest normal)."""
    m = G.shape[1]
    g = np.float32(gamma)
    two = np.float32(2.0)
    for i in prange(G.shape[0]):
        a = sq_rows[i]
        row = G[i]
        bits = np.empty(m, dtype=np.int32)
        scale = bits.view(np.float32)
        for j in range(m):
            d = a + sq_cols[j] - two * row[j]
            x = -g * max(d, np.float32(0.0))
            t = max(x * _LOG2E, np.float32(-126.0))
            k = math.floor(t)
            r = t - k
            p = _P5
            p = p * r + _P4
            p = p * r + _P3
            p = p * r + _P2
            p = p * r + _P1
            p = p * r + _P0
            row[j] = p
            bits[j] = (np.int32(k) + np.int32(127)) << np.int32(23)
        for j in range(m):
            row[j] *= scale[j]


@njit(parallel=True, cache=True)
def rbf_from_dot(G, sq_rows, sq_cols, gamma):
    """float64 version of :func:`rbf_from_dot_f32` with ``math.exp`` (used for predictions)."""
    for i in prange(G.shape[0]):
        a = sq_rows[i]
        for j in range(G.shape[1]):
            d = a + sq_cols[j] - 2.0 * G[i, j]
            G[i, j] = math.exp(-gamma * max(d, 0.0))


@njit(parallel=True, cache=True)
def poly_from_dot(G, gamma, coef0, degree):
    """G[i, j] ← (γ G[i, j] + coef0)^degree (float32 or float64)."""
    for i in prange(G.shape[0]):
        for j in range(G.shape[1]):
            G[i, j] = (gamma * G[i, j] + coef0) ** degree


@njit(parallel=True, cache=True)
def pack_lower_rows(block, first_row, packed):
    """Copy row r of ``block`` (global row i = first_row + r) entries 0..i into the row-major
    packed lower triangle ``packed`` (row i starts at i(i+1)/2)."""
    for r in prange(block.shape[0]):
        i = first_row + r
        start = i * (i + 1) // 2
        for j in range(i + 1):
            packed[start + j] = block[r, j]


@njit(parallel=True, fastmath=True, cache=True)
def rbf_pack_lower_f32(G, sq_rows, sq_cols, gamma, first_row, packed):
    """:func:`rbf_from_dot_f32` on the lower-triangle part of a row block, written straight
    into the packed triangle (as :func:`pack_lower_rows` would copy it); G is left as it was.

    The loop body repeats :func:`rbf_from_dot_f32`'s on purpose: one helper taking the input
    row and the output as two arrays made LLVM drop vectorisation where they are the same
    array (the in-place transform), 6x slower."""
    g = np.float32(gamma)
    two = np.float32(2.0)
    for r in prange(G.shape[0]):
        i = first_row + r
        m = i + 1
        start = i * (i + 1) // 2
        a = sq_rows[r]
        row = G[r]
        out = packed[start:start + m]
        bits = np.empty(m, dtype=np.int32)
        scale = bits.view(np.float32)
        for j in range(m):
            d = a + sq_cols[j] - two * row[j]
            x = -g * max(d, np.float32(0.0))
            t = max(x * _LOG2E, np.float32(-126.0))
            k = math.floor(t)
            rr = t - k
            p = _P5
            p = p * rr + _P4
            p = p * rr + _P3
            p = p * rr + _P2
            p = p * rr + _P1
            p = p * rr + _P0
            out[j] = p
            bits[j] = (np.int32(k) + np.int32(127)) << np.int32(23)
        for j in range(m):
            out[j] *= scale[j]


# --------------------------------------------------------------------------------------------
# products with the packed triangle
# --------------------------------------------------------------------------------------------


def packed_row_cuts(n: int, n_parts: int) -> np.ndarray:
    """Row bounds 0 = c₀ < … < c_T = n splitting a packed triangle of n rows into T parts of
    about equal entries (rows 0..i hold (i+1)(i+2)/2 entries)."""
    n_parts = max(1, min(int(n_parts), n))
    total = n * (n + 1) / 2.0
    targets = np.arange(1, n_parts) * (total / n_parts)
    cuts = np.floor((np.sqrt(1.0 + 8.0 * targets) - 1.0) / 2.0).astype(np.int64)
    return np.unique(np.concatenate([[0], np.clip(cuts, 0, n), [n]])).astype(np.int64)


@njit(fastmath=True, cache=True)
def _packed_rows_symv(packed, V, lo, hi, Y):
    # rows lo..hi−1 of the packed lower triangle, each entry used twice (Q_ij = Q_ji):
    #   Y[c, i] += Σ_{j≤i} Q_ij V[c, j]        Y[c, j] += Q_ij V[c, i] for j < i
    # (the row is read once from memory and stays in cache for every column c)
    for i in range(lo, hi):
        start = i * (i + 1) // 2
        row = packed[start:start + i]
        diag = packed[start + i]
        for c in range(V.shape[0]):
            v = V[c, :i]
            y = Y[c, :i]
            vi = V[c, i]
            acc = np.float32(0.0)
            for j in range(i):
                q = row[j]
                acc += q * v[j]
                y[j] += q * vi
            Y[c, i] += acc + diag * vi


@njit(parallel=True, fastmath=True, cache=True)
def packed_symv(packed, V, cuts, parts, out):
    """out[c] = Q V[c] for every row c of V (k × n, float32), Q symmetric with its lower
    triangle packed row by row (row i at i(i+1)/2). Part t of ``cuts`` (:func:`packed_row_cuts`)
    accumulates into ``parts[t]`` (T × k × n scratch) on its own thread, then the parts are
    summed. Memory bound: one pass over the triangle whatever k is, n(n+1)/2 · 4 bytes."""
    n_parts = cuts.shape[0] - 1
    k, n = V.shape
    for t in prange(n_parts):
        parts[t] = 0.0
        _packed_rows_symv(packed, V, cuts[t], cuts[t + 1], parts[t])
    n_cols = 8 * n_parts
    for b in prange(n_cols):
        lo = b * n // n_cols
        hi = (b + 1) * n // n_cols
        for c in range(k):
            for j in range(lo, hi):
                s = np.float32(0.0)
                for t in range(n_parts):
                    s += parts[t, c, j]
                out[c, j] = s
