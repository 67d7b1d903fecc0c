"""Numba kernels for AltSVM (Park et al., ICML 2015, Algorithm 1). Plain arrays only.

Notation (shared by every kernel below). Comparisons c = (i, j, k): user i prefers item j
(winner) over item k (loser); they are stored sorted by user, ``user_ptr`` is the CSR pointer
over users. The model is X = U Vᵀ + 1 bᵀ (b = 0 and never touched when ``fit_bias`` is 0) and
the primal problem (paper eq. 3, with an optional item bias regularized like V) is

    P(U, V, b) = Σ_c L(z_c) + reg/2 (‖U‖² + ‖V‖² + ‖b‖²),   z_c = u_iᵀ(v_j − v_k) + b_j − b_k.

Losses (``loss`` code): 0 squared hinge L(z) = max(0, 1 − z)² (the paper's), 1 hinge
L(z) = max(0, 1 − z), 2 logistic L(z) = log(1 + e^{−z}).

Each half-step is a linear SVM ``min_w reg/2 ‖w‖² + Σ_c L(wᵀx_c)`` whose dual (eqs. 7 and 9,
rescaled so that a dual variable is a loss slope, independent of ``reg``) is

    min_a  D(a) = 1/(2 reg) ‖Σ_c a_c x_c‖² + Σ_c L*(−a_c),      w(a) = (1/reg) Σ_c a_c x_c,

with L*(−a) = −a + a²/4 on a ≥ 0 (squared hinge), −a on [0, 1] (hinge), a log a +
(1 − a) log(1 − a) on [0, 1] (logistic). At the optimum a_c = −L'(z_c).

* V-step (eqs. 6, 9, 10): w = (V, b), x_c = [u_i; 1] ⊗ (e_j − e_k), duals ``beta``.
* U-step (eqs. 4, 5, 7, 8): separable per user, w = u_i, x_c = v_j − v_k (the bias difference
  b_j − b_k is a constant offset of the margin), duals ``alpha``.

One coordinate step (eqs. 8 and 10) minimizes over the new value a' of one dual

    h(a') = (a' − a) g + q (a' − a)² / 2 + L*(−a'),   g = wᵀx_c (the margin),  q = ‖x_c‖²/reg,

exactly: closed form for the two hinges, safeguarded Newton for the logistic loss.

Stopping rules live in the caller (:mod:`solvers.altsvm`): every kernel here runs a fixed
number of passes, except that the U-step runs extra passes per user while that user's share of
P is above its value at the previous point (:func:`_user_update`).

Random numbers come from a splitmix64 stream whose seed is an argument, so a kernel's result
depends only on its inputs (and, for the Hogwild V-step with several threads, on timing; the
stratified V-step, :func:`vstep_strata`, gives the same numbers on any thread count).
``fastmath`` is limited to reassociation, contraction and signed zeros (it lets LLVM vectorize
the length-r dot products); nothing assumes away NaN or inf. A ``prange`` body only calls a
plain ``@njit`` helper (see :mod:`solvers._altsvm_layout`: inline loops there compile slower).
"""

from __future__ import annotations

import math

import numpy as np
from llvmlite import binding as llvm
from llvmlite import ir
from numba import njit, prange, types
from numba.core import cgutils
from numba.extending import intrinsic

from solvers._altsvm_layout import _span
from solvers._random import GOLDEN, MIX2, next_u64

# Reassociation lets LLVM vectorize the length-r dot products; no flag assumes away NaN/inf.
_FAST = {"contract", "reassoc", "nsz"}

SQUARED_HINGE = 0
HINGE = 1
LOGISTIC = 2

_S11 = np.uint64(11)
_S31 = np.uint64(31)


# --------------------------------------------------------------------------------------------
# random numbers: splitmix64 (solvers._random); state in, (state, value) out
# --------------------------------------------------------------------------------------------


@njit(cache=True)
def _stream_seed(seed, stream):
    """A well-mixed start state for sub-stream ``stream`` of ``seed`` (both uint64)."""
    state, z = next_u64(seed ^ (np.uint64(stream) * MIX2))
    return z


@njit(cache=True)
def _gcd(a, b):
    while b:
        a, b = b, a % b
    return a


@njit(cache=True)
def _affine_order(m, state):
    """A random visiting order of 0..m-1: pos_t = (start + t stride) mod m, gcd(stride, m) = 1.

    Used for one user's comparisons, which sit contiguously in cache: it costs two random
    numbers per pass instead of a shuffle. Returns (state, start, stride).
    """
    if m <= 1:
        return state, 0, 1
    state, z = next_u64(state)
    start = np.int64(z % np.uint64(m))
    state, z = next_u64(state)
    stride = 1 + np.int64(z % np.uint64(m - 1))
    while _gcd(stride, m) != 1:
        stride = stride + 1 if stride + 1 < m else 1
    return state, start, stride


@njit(cache=True)
def _shuffle(idx, lo, hi, state):
    """Fisher-Yates shuffle of ``idx[lo:hi]`` in place; returns the new RNG state."""
    for s in range(hi - 1, lo, -1):
        state, z = next_u64(state)
        t = lo + np.int64((z >> _S11) % np.uint64(s - lo + 1))
        tmp = idx[s]
        idx[s] = idx[t]
        idx[t] = tmp
    return state


# --------------------------------------------------------------------------------------------
# losses, conjugates, and the exact one-dimensional dual step (eqs. 8 and 10)
# --------------------------------------------------------------------------------------------


@njit(cache=True)
def loss_value(loss, z):
    """L(z) for loss code ``loss``."""
    if loss == SQUARED_HINGE:
        m = 1.0 - z
        return m * m if m > 0.0 else 0.0
    if loss == HINGE:
        return 1.0 - z if z < 1.0 else 0.0
    if z > 0.0:
        return math.log1p(math.exp(-z))
    return -z + math.log1p(math.exp(z))


@njit(cache=True)
def loss_slope(loss, z):
    """L'(z) (≤ 0) for loss code ``loss`` (the hinge's subgradient −1 below 1)."""
    if loss == SQUARED_HINGE:
        m = 1.0 - z
        return -2.0 * m if m > 0.0 else 0.0
    if loss == HINGE:
        return -1.0 if z < 1.0 else 0.0
    return -_sigmoid(-z)


@njit(cache=True)
def distinct_pairs(winner, loser, n_items):
    """The distinct (winner, loser) pairs, ordered by winner then loser, and how often each
    occurs: a counting sort by winner, then each winner's losers sorted (on 7M comparisons
    0.39 s; numpy's sort of the winner * n_items + loser keys, the same arrays, 0.56 s)."""
    n = winner.shape[0]
    start = np.zeros(n_items + 1, np.int64)
    for c in range(n):
        start[winner[c] + 1] += 1
    for j in range(n_items):
        start[j + 1] += start[j]
    fill = start[:-1].copy()
    losers = np.empty(n, loser.dtype)
    for c in range(n):
        losers[fill[winner[c]]] = loser[c]
        fill[winner[c]] += 1
    out_w = np.empty(n, winner.dtype)
    count = np.empty(n)
    m = 0
    for j in range(n_items):
        losers[start[j]:start[j + 1]] = np.sort(losers[start[j]:start[j + 1]])
        for t in range(start[j], start[j + 1]):
            if t > start[j] and losers[t] == losers[t - 1]:
                count[m - 1] += 1.0
            else:
                out_w[m] = j
                losers[m] = losers[t]     # m <= t: the compacted losers overwrite read ones
                count[m] = 1.0
                m += 1
    return out_w[:m].copy(), losers[:m].copy(), count[:m].copy()


@njit(cache=True, parallel=True)
def pair_slopes(b, winner, loser, loss, out):
    """``out[c] = −L'(b[winner[c]] − b[loser[c]])`` (≥ 0) for every comparison c: the slopes
    at a bias-only fit, in one parallel pass (numpy's gathers and temporaries over 8.6M
    comparisons took 0.3 s a call)."""
    for c in prange(winner.shape[0]):
        out[c] = -loss_slope(loss, b[winner[c]] - b[loser[c]])


@njit(cache=True, fastmath=_FAST)
def bias_objective(b, winner, loser, count, loss, reg, grad):
    """Σ_p count_p L(b_w − b_l) + reg/2 ‖b‖² over distinct (winner, loser) pairs p; its
    gradient goes to ``grad`` (one pass; numpy's gather, bincount and temporaries took 10x)."""
    value = 0.0
    for j in range(b.shape[0]):
        grad[j] = reg * b[j]
        value += 0.5 * reg * b[j] * b[j]
    for p in range(winner.shape[0]):
        w, lo = winner[p], loser[p]
        z = b[w] - b[lo]
        value += count[p] * loss_value(loss, z)
        d = count[p] * loss_slope(loss, z)
        grad[w] += d
        grad[lo] -= d
    return value


@njit(cache=True)
def _sigmoid(t):
    if t >= 0.0:
        return 1.0 / (1.0 + math.exp(-t))
    e = math.exp(t)
    return e / (1.0 + e)


@njit(cache=True)
def dual_step(loss, a, g, q):
    """Return argmin over a' of h(a') = (a' − a) g + q (a' − a)²/2 + L*(−a') (eqs. 8, 10).

    Squared hinge: a' = max(0, a + (1 − g − a/2) / (q + 1/2)).
    Hinge:         a' = clip(a + (1 − g) / q, 0, 1)  (q = 0: 1 if g < 1, 0 if g > 1).
    Logistic:      a' = σ(t) where t solves φ(t) = g + q (σ(t) − a) + t = 0. φ is increasing
                   with 1 ≤ φ' ≤ 1 + q/4 and changes sign on [−g − q(1 − a), −g + q a]:
                   safeguarded Newton on t (``rtsafe``: a bisection step whenever the Newton
                   step leaves the shrinking bracket or fails to halve |φ|, which breaks the
                   two-cycles Newton falls into on the sigmoid's tails).
    """
    if loss == SQUARED_HINGE:
        a_new = a + (1.0 - g - 0.5 * a) / (q + 0.5)
        return a_new if a_new > 0.0 else 0.0
    if loss == HINGE:
        if q > 0.0:
            a_new = a + (1.0 - g) / q
        elif g < 1.0:
            return 1.0
        elif g > 1.0:
            return 0.0
        else:
            return a
        if a_new < 0.0:
            return 0.0
        if a_new > 1.0:
            return 1.0
        return a_new
    lo = -g - q * (1.0 - a)
    hi = -g + q * a
    if hi - lo <= 1e-300:
        return _sigmoid(-g)
    if a <= 0.0:
        t = lo
    elif a >= 1.0:
        t = hi
    else:
        t = math.log(a) - math.log1p(-a)
        t = min(max(t, lo), hi)
    step_before = hi - lo
    for _ in range(200):
        s = _sigmoid(t)
        phi = g + q * (s - a) + t
        if phi > 0.0:
            hi = t
        elif phi < 0.0:
            lo = t
        else:
            break
        dphi = 1.0 + q * s * (1.0 - s)
        step = phi / dphi
        t_new = t - step
        if not (lo < t_new < hi) or abs(2.0 * phi) > abs(step_before * dphi):
            step = 0.5 * (hi - lo)
            t_new = lo + step
        step_before = step
        if abs(t_new - t) <= 1e-14 * (1.0 + abs(t)) or hi - lo <= 1e-14 * (1.0 + abs(t)):
            t = t_new
            break
        t = t_new
    return _sigmoid(t)


# --------------------------------------------------------------------------------------------
# layout shared by the kernels below (built by :mod:`solvers._altsvm_layout`)
#
# Entries E: the distinct (user, item) pairs that occur in some comparison, sorted by user
# (``entry_ptr`` is the CSR pointer over users, ``entry_item`` the item of each entry). Every
# comparison c knows the entries of its winner and loser, ``pos_w[c]`` and ``pos_l[c]``. Since
# z_c = x_iw − x_il with x_ij = u_iᵀv_j + b_j, margins and both primal rebuilds cost
# O(|E| r + |Ω|) instead of O(|Ω| r) (on rating data |E| is the number of ratings).
#
# Parallel passes over users take them in ``blocks`` (block q: users blocks[q] to
# blocks[q + 1] − 1, about equal numbers of comparisons) dealt to threads dynamically. A user
# owns its comparisons, its entries and its row of U, so these passes are race-free and give
# the same numbers on any number of threads; each block allocates the per-entry scratch of its
# largest user (a few KB) instead of arrays over all entries.
# --------------------------------------------------------------------------------------------


@njit(cache=True)
def _scratch(lo, hi, entry_ptr):
    """Scratch for the entries of any one of users lo..hi-1."""
    biggest = 1
    for i in range(lo, hi):
        biggest = max(biggest, entry_ptr[i + 1] - entry_ptr[i])
    return np.empty(biggest)


@njit(cache=True)
def _join_user(i, old_ptr, old_w, old_l, old_a, old_b, user_ptr, pos_w, pos_l, entry_ptr,
               entry_item, n_items, hi_clip, local, keys, head, tail, nxt, out_a, out_b):
    """User i's part of :func:`join_duals`; returns how many of its comparisons matched."""
    n_lo, n_hi = user_ptr[i], user_ptr[i + 1]
    for c in range(n_lo, n_hi):
        out_a[c] = 0.0
        out_b[c] = 0.0
    if i >= old_ptr.shape[0] - 1 or n_hi == n_lo or old_ptr[i + 1] == old_ptr[i]:
        return 0
    o_lo, o_hi = old_ptr[i], old_ptr[i + 1]
    matched = 0
    same = o_hi - o_lo == n_hi - n_lo
    if same:  # fast path: the user's comparisons, unchanged, in order
        for t in range(n_hi - n_lo):
            if old_w[o_lo + t] != entry_item[pos_w[n_lo + t]] or \
                    old_l[o_lo + t] != entry_item[pos_l[n_lo + t]]:
                same = False
                break
    if same:
        for t in range(n_hi - n_lo):
            out_a[n_lo + t] = _clip(old_a[o_lo + t], hi_clip)
            out_b[n_lo + t] = _clip(old_b[o_lo + t], hi_clip)
        return n_hi - n_lo
    e_lo, e_hi = entry_ptr[i], entry_ptr[i + 1]
    m = e_hi - e_lo
    for e in range(e_lo, e_hi):
        local[entry_item[e]] = e - e_lo
    cap = 1
    while cap < 2 * (o_hi - o_lo):
        cap *= 2
    mask = np.uint64(cap - 1)
    for h in range(cap):
        keys[h] = -1
    for c in range(o_lo, o_hi):  # chain the old comparisons per key, in order
        w, lo = old_w[c], old_l[c]
        if w >= n_items or lo >= n_items or local[w] < 0 or local[lo] < 0:
            continue
        key = local[w] * m + local[lo]
        h = np.int64((np.uint64(key) * GOLDEN >> _S31) & mask)
        while keys[h] >= 0 and keys[h] != key:
            h = (h + 1) & (cap - 1)
        nxt[c] = -1
        if keys[h] < 0:
            keys[h] = key
            head[h] = c
        else:
            nxt[tail[h]] = c
        tail[h] = c
    for c in range(n_lo, n_hi):
        key = np.int64(pos_w[c] - e_lo) * m + (pos_l[c] - e_lo)
        h = np.int64((np.uint64(key) * GOLDEN >> _S31) & mask)
        while keys[h] >= 0 and keys[h] != key:
            h = (h + 1) & (cap - 1)
        if keys[h] == key and head[h] >= 0:
            src = head[h]
            head[h] = nxt[src]
            out_a[c] = _clip(old_a[src], hi_clip)
            out_b[c] = _clip(old_b[src], hi_clip)
            matched += 1
    for e in range(e_lo, e_hi):
        local[entry_item[e]] = -1
    return matched


@njit(cache=True)
def _clip(a, hi):
    """a clipped into [0, hi]; hi = NaN leaves a as it is."""
    if hi != hi:
        return a
    return min(max(a, 0.0), hi)


@njit(parallel=True, cache=True)
def join_duals(parts, old_ptr, old_w, old_l, old_a, old_b, user_ptr, pos_w, pos_l, entry_ptr,
               entry_item, n_items, hi_clip, out_a, out_b):
    """Carry duals keyed by (user, winner, loser) from old comparisons onto new ones.

    The old comparisons are grouped by user (CSR pointer ``old_ptr``); the new ones are
    described by their layout (grouped by user, winner and loser as entry numbers). Per user,
    the old comparisons are chained, in order, per key (winner slot, loser slot) in an
    open-addressing hash table sized to that user's old comparisons, and the m-th new
    comparison of a key takes the duals of the m-th old one, clipped into [0, hi_clip] (NaN:
    not clipped). New comparisons without a partner get 0, old ones without a partner are
    dropped. A user whose comparisons are the old ones in the same order (most users between
    two retrains) is copied without the table. O(|Ω_old| + |Ω_new|) time. Users are split into
    the contiguous ranges ``parts``, one task each, in parallel; a task's scratch is
    O(n_items + max_i |Ω_old,i|). Returns the number matched.
    """
    n_parts = parts.shape[0] - 1
    matched = np.zeros(n_parts, np.int64)
    nxt = np.empty(old_w.shape[0], dtype=np.int64)
    for p in prange(n_parts):
        matched[p] = _join_part(parts[p], parts[p + 1], old_ptr, old_w, old_l, old_a, old_b,
                                user_ptr, pos_w, pos_l, entry_ptr, entry_item, n_items, hi_clip,
                                nxt, out_a, out_b)
    return matched.sum()


@njit(cache=True)
def _join_part(lo, hi, old_ptr, old_w, old_l, old_a, old_b, user_ptr, pos_w, pos_l, entry_ptr,
               entry_item, n_items, hi_clip, nxt, out_a, out_b):
    """:func:`join_duals` for users lo..hi-1, with its own scratch."""
    biggest = 1
    for i in range(lo, min(hi, old_ptr.shape[0] - 1)):
        biggest = max(biggest, old_ptr[i + 1] - old_ptr[i])
    cap_max = 1
    while cap_max < 2 * biggest:
        cap_max *= 2
    local = np.full(max(n_items, 1), -1, dtype=np.int64)
    keys = np.empty(cap_max, dtype=np.int64)
    head = np.empty(cap_max, dtype=np.int64)
    tail = np.empty(cap_max, dtype=np.int64)
    matched = 0
    for i in range(lo, hi):
        matched += _join_user(i, old_ptr, old_w, old_l, old_a, old_b, user_ptr, pos_w, pos_l,
                              entry_ptr, entry_item, n_items, hi_clip, local, keys, head, tail,
                              nxt, out_a, out_b)
    return matched


@njit(cache=True, fastmath=_FAST)
def _user_share(i, user_ptr, pos_w, pos_l, entry_ptr, entry_item, U, V, b, reg, loss, x):
    """User i's share of P: Σ_{c of i} L(z_c) + reg/2 ‖u_i‖² (x: scratch for its entries)."""
    r = V.shape[1]
    e_lo = entry_ptr[i]
    nrm = 0.0
    for f in range(r):
        nrm += U[i, f] * U[i, f]
    for e in range(e_lo, entry_ptr[i + 1]):
        j = entry_item[e]
        t = b[j]
        for f in range(r):
            t += U[i, f] * V[j, f]
        x[e - e_lo] = t
    acc = 0.0
    for c in range(user_ptr[i], user_ptr[i + 1]):
        acc += loss_value(loss, x[pos_w[c] - e_lo] - x[pos_l[c] - e_lo])
    return acc + 0.5 * reg * nrm


@njit(parallel=True, cache=True)
def user_shares(blocks, user_ptr, pos_w, pos_l, entry_ptr, entry_item, U, V, b, reg, loss, out):
    """out[i] = user i's share of P; P = Σ_i out[i] + reg/2 (‖V‖² + ‖b‖²)."""
    for q in prange(blocks.shape[0] - 1):
        _block_shares(blocks[q], blocks[q + 1], user_ptr, pos_w, pos_l, entry_ptr, entry_item,
                      U, V, b, reg, loss, out)


@njit(cache=True)
def _block_shares(lo, hi, user_ptr, pos_w, pos_l, entry_ptr, entry_item, U, V, b, reg, loss,
                  out):
    x = _scratch(lo, hi, entry_ptr)
    for i in range(lo, hi):
        out[i] = _user_share(i, user_ptr, pos_w, pos_l, entry_ptr, entry_item, U, V, b, reg,
                             loss, x)


# --------------------------------------------------------------------------------------------
# V-step (eqs. 6, 9, 10; Algorithm 1 lines 3-11)
# --------------------------------------------------------------------------------------------


@njit(cache=True)
def sum_squares(V, b):
    """‖V‖² + ‖b‖² (a plain loop: a BLAS call here would wake BLAS threads that then compete
    with the numba threads for the cores)."""
    acc = 0.0
    for j in range(V.shape[0]):
        for f in range(V.shape[1]):
            acc += V[j, f] * V[j, f]
    for j in range(b.shape[0]):
        acc += b[j] * b[j]
    return acc


@njit(cache=True)
def _entry_sums(i, user_ptr, pos_w, pos_l, entry_ptr, duals, out, base):
    """out[e − base] = Σ_{c of i} duals_c (1[pos_w[c] = e] − 1[pos_l[c] = e]) over user i's
    entries e, summed in comparison order."""
    for e in range(entry_ptr[i], entry_ptr[i + 1]):
        out[e - base] = 0.0
    for c in range(user_ptr[i], user_ptr[i + 1]):
        a = duals[c]
        if a != 0.0:
            out[pos_w[c] - base] += a
            out[pos_l[c] - base] -= a


@njit(parallel=True, cache=True)
def scatter_duals(blocks, user_ptr, pos_w, pos_l, entry_ptr, duals, out):
    """out[e] = Σ_c duals_c (1[pos_w[c] = e] − 1[pos_l[c] = e]): duals summed per entry."""
    for q in prange(blocks.shape[0] - 1):
        _block_entry_sums(blocks[q], blocks[q + 1], user_ptr, pos_w, pos_l, entry_ptr, duals,
                          out)


@njit(cache=True)
def _block_entry_sums(lo, hi, user_ptr, pos_w, pos_l, entry_ptr, duals, out):
    for i in range(lo, hi):
        _entry_sums(i, user_ptr, pos_w, pos_l, entry_ptr, duals, out, 0)


@njit(parallel=True, cache=True)
def entries_matvec(blocks, entry_ptr, entry_item, data, x, out):
    """out = G x for the users x items matrix G with value data[e] at (user of e, item of e)
    (reg_max's σ_max), in parallel over blocks of users."""
    for q in prange(blocks.shape[0] - 1):
        _rows_times(blocks[q], blocks[q + 1], entry_ptr, entry_item, data, x, out)


@njit(cache=True)
def _rows_times(lo, hi, entry_ptr, entry_item, data, x, out):
    for i in range(lo, hi):
        t = 0.0
        for e in range(entry_ptr[i], entry_ptr[i + 1]):
            t += data[e] * x[entry_item[e]]
        out[i] = t


@njit(parallel=True, cache=True)
def entries_rmatvec(parts, entry_ptr, entry_item, data, y, acc, out):
    """out = Gᵀ y: the contiguous user ranges ``parts`` add into their own rows of ``acc``
    (parts x items) in parallel, then out = Σ_p acc[p] in order p = 0, 1, ..."""
    n_parts = parts.shape[0] - 1
    for p in prange(n_parts):
        _rows_transposed(parts[p], parts[p + 1], entry_ptr, entry_item, data, y, acc[p])
    n_spans = min(n_parts, acc.shape[1])
    for t in prange(n_spans):
        lo, hi = _span(acc.shape[1], n_spans, t)
        _sum_rows(acc, lo, hi, out)


@njit(cache=True)
def _rows_transposed(lo, hi, entry_ptr, entry_item, data, y, out):
    """out = Σ_{users lo..hi-1} y_i G_i."""
    out[:] = 0.0
    for i in range(lo, hi):
        yi = y[i]
        if yi != 0.0:
            for e in range(entry_ptr[i], entry_ptr[i + 1]):
                out[entry_item[e]] += data[e] * yi


@njit(cache=True)
def _sum_rows(acc, lo, hi, out):
    """out[lo:hi] = Σ_p acc[p, lo:hi], adding in order p = 0, 1, ..."""
    for j in range(lo, hi):
        out[j] = acc[0, j]
    for p in range(1, acc.shape[0]):
        for j in range(lo, hi):
            out[j] += acc[p, j]


@njit(cache=True, fastmath=_FAST)
def _add_user(i, entry_ptr, entry_item, B, U, reg, fit_bias, V, b):
    """(V, b)[items of user i] += (1/reg) B_ij (u_i, 1), B over the user's entries."""
    r = U.shape[1]
    e_lo = entry_ptr[i]
    for e in range(e_lo, entry_ptr[i + 1]):
        coef = B[e - e_lo] / reg
        if coef != 0.0:
            j = entry_item[e]
            for f in range(r):
                V[j, f] += coef * U[i, f]
            if fit_bias:
                b[j] += coef


@njit(parallel=True, cache=True)
def items_from_duals(parts, user_ptr, pos_w, pos_l, entry_ptr, entry_item, beta, U, reg,
                     fit_bias, acc_V, acc_b, V, b):
    """Algorithm 1 line 3, exactly: (v_j, b_j) = (1/reg) Σ_c beta_c s_cj [u_i; 1].

    With s_cj = +1 when j won comparison c and −1 when it lost, v_j = (1/reg) Σ_{entries
    (i, j)} B_ij u_i where B_ij sums user i's duals per entry. One pass over users: per user,
    B over its entries (in scratch), then added into the rows of its items. Users are split
    into the contiguous ranges ``parts`` (P = parts.size − 1 of them, one task each, in
    parallel), part p adding into its own accumulators ``acc_V[p]``, ``acc_b[p]``; then
    V = Σ_p acc_V[p] in order p = 0..P−1, in parallel over items. With P = 1 pass V[None] and
    b[None] as the accumulators: each v_j is then summed over its users in increasing order.
    The sum's rounding depends on P only. b is left alone unless ``fit_bias``.
    """
    n_parts = parts.shape[0] - 1
    n_items = V.shape[0]
    for p in prange(n_parts):
        _rebuild_part(parts[p], parts[p + 1], user_ptr, pos_w, pos_l, entry_ptr, entry_item,
                      beta, U, reg, fit_bias, acc_V[p], acc_b[p])
    if n_parts > 1:
        n_spans = min(n_parts, n_items)
        for t in prange(n_spans):
            lo, hi = _span(n_items, n_spans, t)
            sum_parts(acc_V, acc_b, lo, hi, fit_bias, V, b)


@njit(cache=True)
def _rebuild_part(lo, hi, user_ptr, pos_w, pos_l, entry_ptr, entry_item, beta, U, reg,
                  fit_bias, V, b):
    """(V, b) = (1/reg) Σ_{users lo..hi-1} Σ_{entries (i, j)} B_ij (u_i, 1) (b only with
    ``fit_bias``)."""
    V[:] = 0.0
    if fit_bias:
        b[:] = 0.0
    add_users(lo, hi, user_ptr, pos_w, pos_l, entry_ptr, entry_item, beta, U, reg, fit_bias,
              V, b)


@njit(cache=True)
def add_users(lo, hi, user_ptr, pos_w, pos_l, entry_ptr, entry_item, beta, U, reg, fit_bias,
              V, b):
    """(V, b) += (1/reg) Σ_{users lo..hi-1, in order} Σ_{entries (i, j)} B_ij (u_i, 1): a
    part's sum continued from where another process left it (the Ray engine's rebuild of a
    part whose users two workers hold)."""
    B = _scratch(lo, hi, entry_ptr)
    for i in range(lo, hi):
        _entry_sums(i, user_ptr, pos_w, pos_l, entry_ptr, beta, B, entry_ptr[i])
        _add_user(i, entry_ptr, entry_item, B, U, reg, fit_bias, V, b)


@njit(cache=True)
def sum_parts(acc_V, acc_b, lo, hi, fit_bias, V, b):
    """Rows lo..hi-1 of V (and b) = Σ_p acc_V[p] (acc_b[p]), adding in order p = 0, 1, ..."""
    for j in range(lo, hi):
        for f in range(V.shape[1]):
            V[j, f] = acc_V[0, j, f]
        if fit_bias:
            b[j] = acc_b[0, j]
    for p in range(1, acc_V.shape[0]):
        for j in range(lo, hi):
            for f in range(V.shape[1]):
                V[j, f] += acc_V[p, j, f]
            if fit_bias:
                b[j] += acc_b[p, j]


@njit(cache=True, fastmath=_FAST)
def _vstep_block(c0, c1, vu, vw, vl, beta, U, V, b, fit_bias, reg, loss):
    """Stochastic dual CD steps (eq. 10) on comparisons c0..c1-1 of the V-step arrays.

    Keeps V = (1/reg) Σ beta_c u_i (e_j − e_k)ᵀ (and b likewise) after every step.
    """
    r = U.shape[1]
    for c in range(c0, c1):
        i = vu[c]
        j = vw[c]
        k = vl[c]
        g = 0.0
        uu = 0.0
        for f in range(r):
            uf = U[i, f]
            g += uf * (V[j, f] - V[k, f])
            uu += uf * uf
        if fit_bias:
            g += b[j] - b[k]
            uu += 1.0
        a = beta[c]
        a_new = dual_step(loss, a, g, 2.0 * uu / reg)
        if a_new != a:
            beta[c] = a_new
            d = (a_new - a) / reg
            for f in range(r):
                t = d * U[i, f]
                V[j, f] += t
                V[k, f] -= t
            if fit_bias:
                b[j] += d
                b[k] -= d


@njit(cache=True)
def vstep_serial(blocks, block_start, vu, vw, vl, beta, U, V, b, fit_bias, reg, loss, seed):
    """One V-step epoch, one thread.

    Problem (eq. 6 with bias): min_{V,b} reg/2 (‖V‖² + ‖b‖²) + Σ_c L(z_c), U fixed, through
    its dual (eq. 9) in ``beta``; on entry V, b must equal (1/reg) Σ beta_c x_c (see
    :func:`items_from_duals`). The comparisons (arrays ``vu, vw, vl, beta``) are cut into
    blocks, block q covering positions ``block_start[q]:block_start[q + 1]``. Each epoch visits
    the blocks in a fresh random order (``blocks`` is reshuffled in place) and each block
    sequentially, so memory is read in order. No stopping rule inside: the caller checks the
    primal objective after each epoch.
    """
    _shuffle(blocks, 0, blocks.shape[0], seed)
    for q in range(blocks.shape[0]):
        _vstep_block(block_start[blocks[q]], block_start[blocks[q] + 1], vu, vw, vl, beta, U, V,
                     b, fit_bias, reg, loss)


@njit(parallel=True, cache=True)
def vstep_hogwild(blocks, block_start, vu, vw, vl, beta, U, V, b, fit_bias, reg, loss, seed):
    """One V-step epoch, lock-free over threads (paper §4.1; Hogwild, PASSCoDe).

    Same problem and visiting order as :func:`vstep_serial`, but the blocks are dealt to the
    threads dynamically (chunks set by ``numba.set_parallel_chunksize``), which write the 2r + 2
    numbers of v_j, v_k, b_j, b_k of each step without locks.
    """
    _shuffle(blocks, 0, blocks.shape[0], seed)
    for q in prange(blocks.shape[0]):
        _vstep_block(block_start[blocks[q]], block_start[blocks[q] + 1], vu, vw, vl, beta, U, V,
                     b, fit_bias, reg, loss)


# --------------------------------------------------------------------------------------------
# Stratified V-step: parallel, and the same numbers on any thread count
#
# Items are split into B blocks (B even, set by the data: see ``_altsvm_solver.strata``). A
# comparison c = (i, j, k) reads u_i (fixed during the V-step) and reads and writes only
# v_j, v_k, b_j, b_k and its own dual beta_c: it touches the item blocks b(j) and b(k). Group
# the comparisons into tasks by the unordered block pair {b(j), b(k)}: B(B − 1)/2 off-diagonal
# tasks {p, q} and B diagonal ones {p}. Two tasks whose block sets are disjoint write disjoint
# memory, so they commute exactly (bit for bit). The rounds of a round-robin tournament on B
# players (the circle method: fix block B − 1, rotate the others) are B − 1 perfect matchings
# of the blocks, covering every pair once:
#
#     round ρ = 0 .. B − 2:  {B − 1, ρ}  and  {(ρ + s) mod (B − 1), (ρ − s) mod (B − 1)},
#                            s = 1 .. B/2 − 1,
#
# and one more round holds the B diagonal tasks. In each round every block is in exactly one
# task, so a round's tasks run in parallel (dealt to threads dynamically, largest first), with
# a barrier between rounds (DSGD's strata, Gemulla et al., KDD 2011, for a loss that couples
# two columns). An epoch is every round once, in an order drawn from ``seed`` alone; a task
# visits its comparisons (stored contiguously, by user) sequentially from a start drawn from
# (``seed``, task). Hence the sequence of floating-point operations on each v_j, b_j and beta_c
# is fixed by the data and the seed: it is that of the serial execution round by round, task
# by task, whatever the number of threads or the timing. Per epoch there are B barriers.
# --------------------------------------------------------------------------------------------

PREFETCH_AHEAD = 12  # comparisons ahead whose u_i is prefetched in a task
# the intrinsic's name mangles the pointer type: opaque ``ptr`` from LLVM 15 on, i8* before
_PREFETCH = "llvm.prefetch.p0" if llvm.llvm_version_info[0] >= 15 else "llvm.prefetch.p0i8"


@intrinsic
def _prefetch(typingctx, arr, i, f):
    """Hint the CPU to fetch ``arr[i, f]`` into cache (``llvm.prefetch``: read, high locality)
    without waiting for it: in task order the rows u_i are scattered over U."""
    sig = types.void(arr, i, f)

    def codegen(context, builder, signature, args):
        aryty = signature.args[0]
        ary = context.make_array(aryty)(context, builder, args[0])
        ii = context.cast(builder, args[1], signature.args[1], types.intp)
        ff = context.cast(builder, args[2], signature.args[2], types.intp)
        ptr = cgutils.get_item_pointer2(context, builder, ary.data,
                                        cgutils.unpack_tuple(builder, ary.shape),
                                        cgutils.unpack_tuple(builder, ary.strides),
                                        aryty.layout, [ii, ff], wraparound=False,
                                        boundscheck=False)
        i8p, i32 = ir.IntType(8).as_pointer(), ir.IntType(32)
        fn = cgutils.get_or_insert_function(
            builder.module, ir.FunctionType(ir.VoidType(), [i8p, i32, i32, i32]),
            _PREFETCH)
        builder.call(fn, [builder.bitcast(ptr, i8p), i32(0), i32(3), i32(1)])
        return context.get_dummy_value()

    return sig, codegen


@njit(cache=True, fastmath=_FAST)
def _vstep_task(c0, c1, start, tu, tw, tl, beta, U, V, b, fit_bias, reg, loss):
    """Dual CD steps (eq. 10) on comparisons c0..c1-1 of the task-ordered arrays, visited
    c0 + start, ..., c1 − 1, c0, ..., c0 + start − 1 (``beta`` in task order too)."""
    r = U.shape[1]
    m = c1 - c0
    for s in range(m):
        if r > 0 and s + PREFETCH_AHEAD < m:
            ahead = c0 + (start + s + PREFETCH_AHEAD) % m
            ip = tu[ahead]
            for f in range(0, r, 8):  # a cache line holds 8 float64
                _prefetch(U, ip, f)
            _prefetch(U, ip, r - 1)
        c = c0 + (start + s) % m
        i = tu[c]
        j = tw[c]
        k = tl[c]
        g = 0.0
        uu = 0.0
        for f in range(r):
            uf = U[i, f]
            g += uf * (V[j, f] - V[k, f])
            uu += uf * uf
        if fit_bias:
            g += b[j] - b[k]
            uu += 1.0
        a = beta[c]
        a_new = dual_step(loss, a, g, 2.0 * uu / reg)
        if a_new != a:
            beta[c] = a_new
            d = (a_new - a) / reg
            for f in range(r):
                t = d * U[i, f]
                V[j, f] += t
                V[k, f] -= t
            if fit_bias:
                b[j] += d
                b[k] -= d


@njit(cache=True)
def _run_task(k, t, task_ptr, tu, tw, tl, beta, U, V, b, fit_bias, reg, loss, seed):
    """Task t of the schedule, stored as the k-th task of the arrays given (k = t in one
    process; a Ray worker holds some tasks)."""
    c0, c1 = task_ptr[k], task_ptr[k + 1]
    if c1 > c0:
        _, z = next_u64(_stream_seed(seed, t))
        _vstep_task(c0, c1, np.int64(z % np.uint64(c1 - c0)), tu, tw, tl, beta, U, V, b,
                    fit_bias, reg, loss)


@njit(cache=True)
def epoch_rounds(round_order, seed):
    """The epoch's order of the rounds (``round_order``, one entry per round), a shuffle drawn
    from ``seed``."""
    for q in range(round_order.shape[0]):
        round_order[q] = q
    _shuffle(round_order, 0, round_order.shape[0], seed)


@njit(parallel=True, cache=True)
def vstep_strata(round_order, round_ptr, task_ptr, task_ids, tu, tw, tl, beta, U, V, b,
                 fit_bias, reg, loss, seed):
    """One V-step epoch on the stratified schedule above, on any number of threads.

    Problem (eq. 6 with bias): min_{V,b} reg/2 (‖V‖² + ‖b‖²) + Σ_c L(z_c), U fixed, through
    its dual (eq. 9); on entry V, b must equal (1/reg) Σ beta_c x_c. Rounds, in the order
    ``round_order`` (:func:`epoch_rounds`): the k-th round's tasks are stored tasks
    ``round_ptr[ρ]..round_ptr[ρ + 1] − 1``; stored task k: positions ``task_ptr[k]..task_ptr[k
    + 1] − 1`` of ``tu, tw, tl, beta`` (the comparisons in task order,
    :func:`_altsvm_solver.strata`), its schedule number ``task_ids[k]`` (which seeds its
    start). One process stores every task (``task_ids`` = 0, 1, ...); a Ray worker the tasks
    of one round it holds, with their items renumbered into the blocks it was sent. No
    stopping rule inside: the caller checks the objective.
    """
    for q in range(round_order.shape[0]):
        rho = round_order[q]
        for k in prange(round_ptr[rho], round_ptr[rho + 1]):
            _run_task(k, task_ids[k], task_ptr, tu, tw, tl, beta, U, V, b, fit_bias, reg,
                      loss, seed)


@njit(cache=True)
def _take_span(src, perm, lo, hi, out):
    for p in range(lo, hi):
        out[p] = src[perm[p]]


@njit(cache=True)
def _put_span(src, perm, lo, hi, out):
    for p in range(lo, hi):
        out[perm[p]] = src[p]


@njit(parallel=True, cache=True)
def take_duals(src, perm, out, n_spans):
    """out[p] = src[perm[p]] (duals from layout order into task order)."""
    n = perm.shape[0]
    for t in prange(n_spans):
        lo, hi = _span(n, n_spans, t)
        _take_span(src, perm, lo, hi, out)


@njit(parallel=True, cache=True)
def put_duals(src, perm, out, n_spans):
    """out[perm[p]] = src[p] (duals from task order back into layout order)."""
    n = perm.shape[0]
    for t in prange(n_spans):
        lo, hi = _span(n, n_spans, t)
        _put_span(src, perm, lo, hi, out)


# --------------------------------------------------------------------------------------------
# U-step (eqs. 4, 5, 7, 8; Algorithm 1 lines 13-20), independent per user
# --------------------------------------------------------------------------------------------


@njit(cache=True, fastmath=_FAST)
def _user_rebuild(i, user_ptr, pos_w, pos_l, entry_ptr, entry_item, alpha, V, reg, A, U):
    """u_i = (1/reg) Σ_c alpha_c (v_j − v_k) into ``U[i]`` (Algorithm 1 line 13), exactly:
    the duals are summed per entry first (A: scratch for the user's entries),
    u_i = (1/reg) Σ_{entries (i, j)} A_ij v_j."""
    r = V.shape[1]
    e_lo = entry_ptr[i]
    _entry_sums(i, user_ptr, pos_w, pos_l, entry_ptr, alpha, A, e_lo)
    for f in range(r):
        U[i, f] = 0.0
    for e in range(e_lo, entry_ptr[i + 1]):
        coef = A[e - e_lo] / reg
        if coef != 0.0:
            j = entry_item[e]
            for f in range(r):
                U[i, f] += coef * V[j, f]


@njit(parallel=True, cache=True)
def users_from_duals(blocks, user_ptr, pos_w, pos_l, entry_ptr, entry_item, alpha, V, reg, U):
    """U from the U-step duals and V, exactly (LIBLINEAR's setup loop for a warm start)."""
    for q in prange(blocks.shape[0] - 1):
        _block_rebuild(blocks[q], blocks[q + 1], user_ptr, pos_w, pos_l, entry_ptr, entry_item,
                       alpha, V, reg, U)


@njit(cache=True)
def _block_rebuild(lo, hi, user_ptr, pos_w, pos_l, entry_ptr, entry_item, alpha, V, reg, U):
    A = _scratch(lo, hi, entry_ptr)
    for i in range(lo, hi):
        _user_rebuild(i, user_ptr, pos_w, pos_l, entry_ptr, entry_item, alpha, V, reg, A, U)


@njit(cache=True, fastmath=_FAST)
def _user_cd(i, user_ptr, cw, cl, alpha, U, V, b, reg, loss, state):
    """One pass of dual CD steps (eq. 8) over user i's comparisons in a random affine order."""
    lo = user_ptr[i]
    m = user_ptr[i + 1] - lo
    r = V.shape[1]
    state, pos, stride = _affine_order(m, state)
    for _ in range(m):
        c = lo + pos
        pos += stride
        if pos >= m:
            pos -= m
        j = cw[c]
        k = cl[c]
        g = b[j] - b[k]
        dd = 0.0
        for f in range(r):
            d = V[j, f] - V[k, f]
            g += U[i, f] * d
            dd += d * d
        a = alpha[c]
        a_new = dual_step(loss, a, g, dd / reg)
        if a_new != a:
            alpha[c] = a_new
            step = (a_new - a) / reg
            for f in range(r):
                U[i, f] += step * (V[j, f] - V[k, f])
    return state


@njit(cache=True)
def _user_update(i, user_ptr, cw, cl, pos_w, pos_l, entry_ptr, entry_item, alpha, U_old, V, b,
                 reg, loss, max_extra, seed, base, A, U, shares):
    """User i's U-step (Algorithm 1 lines 13-20), fused with the objective bookkeeping.

    Problem (5): min_u reg/2 ‖u‖² + Σ_{c of i} L(uᵀ(v_j − v_k) + b_j − b_k), V and b fixed,
    through its dual (7) in ``alpha``. Rebuilds u_i from alpha with the current V, records
    user i's share of P at the previous point, shares[i, 0] = Σ L(z_c(U_old)) +
    reg/2 ‖u_i^old‖², runs one random-order CD pass, then up to ``max_extra`` more while the
    share at the new u_i is above shares[i, 0]; if it still is, u_i = u_i^old (alpha keeps its
    progress). So the U-step never increases eq. (3). shares[i, 1] is the final share.
    ``A`` is scratch for the user's entries; the user's random stream is that of user
    i + ``base`` (0 in one process; a Ray worker's first user otherwise).
    """
    old = _user_share(i, user_ptr, pos_w, pos_l, entry_ptr, entry_item, U_old, V, b, reg, loss,
                      A)
    shares[i, 0] = old
    _user_rebuild(i, user_ptr, pos_w, pos_l, entry_ptr, entry_item, alpha, V, reg, A, U)
    state = _stream_seed(seed, i + base)
    for epoch in range(max_extra + 1):
        state = _user_cd(i, user_ptr, cw, cl, alpha, U, V, b, reg, loss, state)
        new = _user_share(i, user_ptr, pos_w, pos_l, entry_ptr, entry_item, U, V, b, reg, loss,
                          A)
        if new <= old:
            shares[i, 1] = new
            return
    for f in range(V.shape[1]):
        U[i, f] = U_old[i, f]
    shares[i, 1] = old


@njit(cache=True)
def ustep_serial(blocks, user_ptr, cw, cl, pos_w, pos_l, entry_ptr, entry_item, alpha, U_old, V,
                 b, reg, loss, max_extra, seed, base, U, shares):
    """The U-step for all users (see :func:`_user_update`), one thread."""
    for q in range(blocks.shape[0] - 1):
        _block_update(blocks[q], blocks[q + 1], user_ptr, cw, cl, pos_w, pos_l, entry_ptr,
                      entry_item, alpha, U_old, V, b, reg, loss, max_extra, seed, base, U,
                      shares)


@njit(cache=True)
def _block_update(lo, hi, user_ptr, cw, cl, pos_w, pos_l, entry_ptr, entry_item, alpha, U_old,
                  V, b, reg, loss, max_extra, seed, base, U, shares):
    """The U-step of users lo..hi-1 (:func:`_user_update`), with scratch for the largest."""
    A = _scratch(lo, hi, entry_ptr)
    for i in range(lo, hi):
        _user_update(i, user_ptr, cw, cl, pos_w, pos_l, entry_ptr, entry_item, alpha, U_old, V,
                     b, reg, loss, max_extra, seed, base, A, U, shares)


@njit(parallel=True, cache=True)
def ustep_parallel(blocks, user_ptr, cw, cl, pos_w, pos_l, entry_ptr, entry_item, alpha, U_old,
                   V, b, reg, loss, max_extra, seed, base, U, shares):
    """The U-step with blocks of users dealt to threads dynamically. Race-free (each user owns
    its comparisons, entries and row of U) and, with per-user random streams, gives the same
    numbers for any thread count."""
    for q in prange(blocks.shape[0] - 1):
        _block_update(blocks[q], blocks[q + 1], user_ptr, cw, cl, pos_w, pos_l, entry_ptr,
                      entry_item, alpha, U_old, V, b, reg, loss, max_extra, seed, base, U,
                      shares)


@njit(cache=True)
def solve_users(user_ptr, cw, cl, alpha, U, V, b, reg, loss, n_epochs, seed):
    """``n_epochs`` CD passes per user on problem (5), from the current alpha and U (which
    must equal (1/reg) Σ alpha_c (v_j − v_k)); used by fold-in, to a duality gap."""
    for i in range(U.shape[0]):
        state = _stream_seed(seed, i)
        for _ in range(n_epochs):
            state = _user_cd(i, user_ptr, cw, cl, alpha, U, V, b, reg, loss, state)
