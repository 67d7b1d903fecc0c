"""Numba kernels for within-user comparisons from ratings (used by ``solvers.pairs``).

Input: ratings grouped by user (``starts[g]:starts[g+1]`` is user group g, in input order).
Every pair (a, b), a < b inside a group, with r[a] != r[b] is a comparison, the higher rating
winning. With a cap c per user, ``random`` keeps the c comparisons of smallest hash
h(seed, user, lower item, higher item) (a bottom-c sketch: a uniform sample, and a *stable* one:
a comparison's hash does not depend on the user's other ratings, so when the user rates more
items the kept set changes only by the new pairs that hash below the old cut, and a warm start
finds its duals again); ``largest_gap`` keeps the c with the largest |r[a] - r[b]|, ties
broken by the same hash. Output rows keep the enumeration order (by user, then a, then b).

:func:`fill_implicit` samples "the user met item i, so i beats item j" comparisons: for the
k-th comparison of interaction (u, i) it tries candidates j from the hash h(seed, u, i, k, t),
t = 0, 1, ... (uniform over the items, or in proportion to integer item weights) until j is not
one of u's items, so each sample too depends only on (u, i, k), the user's items and the weights.
"""

from __future__ import annotations

import numpy as np
from numba import njit, prange

from solvers._random import next_u64

MAX_TRIES = 64  # candidates tried per implicit comparison before giving up on it


@njit(cache=True, parallel=True)
def count_pairs(starts, r):
    """Comparisons (pairs with different ratings) per user group."""
    n_groups = starts.shape[0] - 1
    counts = np.zeros(n_groups, np.int64)
    for g in prange(n_groups):
        c = 0
        for a in range(starts[g], starts[g + 1]):
            for b in range(a + 1, starts[g + 1]):
                if r[a] != r[b]:
                    c += 1
        counts[g] = c
    return counts


@njit(cache=True)
def _write(out, k, u, item, r, a, b):
    """Row k = (u, winner, loser) of the pair (a, b): the higher rating wins."""
    out[k, 0] = u
    if r[a] > r[b]:
        out[k, 1] = item[a]
        out[k, 2] = item[b]
    else:
        out[k, 1] = item[b]
        out[k, 2] = item[a]


@njit(cache=True)
def hash4(seed, a, b, c):
    """A 64-bit hash of three non-negative integers under ``seed`` (splitmix64 rounds)."""
    _, h = next_u64(np.uint64(seed) ^ np.uint64(a))
    _, h = next_u64(h ^ np.uint64(b))
    _, h = next_u64(h ^ np.uint64(c))
    return h


@njit(cache=True, parallel=True)
def fill_pairs(starts, r, user, salt, item, counts, cap, largest_gap, seed, out):
    """Write the kept comparisons as rows (user, winner item, loser item) into ``out``.

    ``cap < 0`` keeps every pair; ``out`` has ``sum(min(counts, cap))`` rows. Users run in
    parallel; every choice depends on (seed, the row's ``salt``, pair) only, so not on the
    thread count.
    """
    n_groups = starts.shape[0] - 1
    kept = np.empty(n_groups + 1, np.int64)
    kept[0] = 0
    for g in range(n_groups):
        kept[g + 1] = kept[g] + (counts[g] if cap < 0 else min(counts[g], cap))
    for g in prange(n_groups):
        lo, hi, total = starts[g], starts[g + 1], counts[g]
        want = kept[g + 1] - kept[g]
        k = kept[g]
        if want == total:
            for a in range(lo, hi):
                for b in range(a + 1, hi):
                    if r[a] != r[b]:
                        _write(out, k, user[a], item, r, a, b)
                        k += 1
            continue
        # rank the pairs by (−gap if largest_gap,) hash; keep the ``want`` first, in order
        key = np.empty(total, np.float64)
        hkey = np.empty(total, np.uint64)
        t = 0
        for a in range(lo, hi):
            for b in range(a + 1, hi):
                if r[a] != r[b]:
                    lo_item, hi_item = min(item[a], item[b]), max(item[a], item[b])
                    hkey[t] = hash4(seed, salt[a], lo_item, hi_item)
                    key[t] = -abs(r[a] - r[b]) if largest_gap else 0.0
                    t += 1
        order = np.argsort(hkey)
        order = order[np.argsort(key[order], kind="mergesort")]
        keep = np.zeros(total, np.bool_)
        keep[order[:want]] = True
        t = 0
        for a in range(lo, hi):
            for b in range(a + 1, hi):
                if r[a] != r[b]:
                    if keep[t]:
                        _write(out, k, user[a], item, r, a, b)
                        k += 1
                    t += 1


@njit(cache=True, parallel=True)
def fill_implicit(starts, user, item, seen_items, seen_lo, seen_hi, per, offsets, n_items, cum,
                  seed, out, ok):
    """Rows ``offsets[x] + k``, k < ``per[g]``, = (user, item of x, sampled item j) for the
    comparisons of winner x of group g (``starts[g]:starts[g+1]``); ``ok`` marks the rows where
    a j was found.

    ``seen_items[seen_lo[g]:seen_hi[g]]`` (sorted) are the items user group g met: they are
    never sampled. ``cum`` (int64, the cumulative sums of positive item weights) samples item j
    with probability weight_j / cum[-1]; an empty ``cum`` samples uniformly. Both draw a value
    v from the next power of two >= the total (n_items, or cum[-1]) and reject it past the
    total, so the values that land on an item do not depend on the total: h mod n_items, or an
    inverse CDF normalized to 1, would move almost every sample when one item is added (or
    any weight changes), and a warm start would find none of its duals again. With rejection,
    a catalog that grows by a fraction f moves about a fraction f of them, until the total
    passes a power of two; weights that stay as they were move none.
    """
    n_groups = starts.shape[0] - 1
    total = n_items if cum.shape[0] == 0 else cum[-1]
    span = np.uint64(1)
    while span < np.uint64(total):
        span = span * np.uint64(2)
    mask = span - np.uint64(1)
    for g in prange(n_groups):
        met = seen_items[seen_lo[g]:seen_hi[g]]
        for x in range(starts[g], starts[g + 1]):
            for k in range(per[g]):
                row = offsets[x] + k
                out[row, 0] = user[x]
                out[row, 1] = item[x]
                ok[row] = False
                base = hash4(seed, user[x], item[x], k)
                for t in range(MAX_TRIES):
                    _, h = next_u64(base + np.uint64(t))
                    v = np.int64(h & mask)
                    if v >= total:
                        continue
                    j = v if cum.shape[0] == 0 else np.int64(
                        np.searchsorted(cum, v, side="right"))
                    p = np.searchsorted(met, j)
                    if p < met.shape[0] and met[p] == j:
                        continue
                    out[row, 2] = j
                    ok[row] = True
                    break


@njit(cache=True, parallel=True)
def keep_smallest_rows(starts, rows, seed, cap, keep):
    """``keep[r]`` for the rows ``starts[g]:starts[g+1]`` of group g: whether the hash of row
    ``r`` (:func:`hash4` of ``seed`` and its three columns) is among the group's ``cap``
    smallest (ties by position: a stable order, as ``np.lexsort((h, g))``). Only a group
    past ``cap`` hashes its rows."""
    for g in prange(starts.shape[0] - 1):
        lo, hi = starts[g], starts[g + 1]
        if hi - lo <= cap:
            keep[lo:hi] = True
            continue
        h = np.empty(hi - lo, np.uint64)
        for r in range(lo, hi):
            h[r - lo] = hash4(seed, rows[r, 0], rows[r, 1], rows[r, 2])
        keep[lo:hi] = False
        order = np.argsort(h, kind="mergesort")
        for t in range(cap):
            keep[lo + order[t]] = True
