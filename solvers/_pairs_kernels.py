"""Numba kernels for within-user comparisons from ratings (used by ``solvers.pairs``).

Input: ratings grouped by user (``starts[g]:starts[g+1]`` is user group g, in input order).
Every pair (a, b), a < b inside a group, with r[a] != r[b] is a comparison, the higher rating
winning. With a cap c per user, ``random`` keeps a uniform sample of c of a user's comparisons
without replacement (Floyd's algorithm over pair numbers, then one walk over the pairs);
``largest_gap`` keeps the c with the largest |r[a] - r[b]|, ties broken at random. Output rows
keep the enumeration order (by user, then a, then b). Random state: a seed passed in.
"""

from __future__ import annotations

import numpy as np
from numba import njit, prange


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


@njit(cache=True, parallel=True)
def fill_pairs(starts, r, user, item, counts, cap, largest_gap, seed, out):
    """Write the kept comparisons as rows (user, winner item, loser item) into ``out``.

    ``cap < 0`` keeps every pair; ``out`` has ``sum(min(counts, cap))`` rows.
    Users run in parallel; user g draws from its own seed ``seed + g``, so the result does not
    depend on the number of threads.
    """
    n_groups = starts.shape[0] - 1
    kept = np.empty(n_groups + 1, np.int64)
    kept[0] = 0
    for g in range(n_groups):
        kept[g + 1] = kept[g] + (counts[g] if cap < 0 else min(counts[g], cap))
    for g in prange(n_groups):
        np.random.seed(seed + g)
        lo, hi, total = starts[g], starts[g + 1], counts[g]
        want = kept[g + 1] - kept[g]
        k = kept[g]
        if want == total or not largest_gap:
            # a uniform subset of ``want`` of the ``total`` pair numbers (Floyd's algorithm),
            # then one walk over the pairs that keeps the chosen numbers in order
            keep = np.ones(total, np.bool_)
            if want < total:
                keep[:] = False
                for j in range(total - want, total):
                    t = np.random.randint(0, j + 1)
                    if keep[t]:
                        keep[j] = True
                    else:
                        keep[t] = True
            seen = 0
            for a in range(lo, hi):
                for b in range(a + 1, hi):
                    if r[a] == r[b]:
                        continue
                    if keep[seen]:
                        _write(out, k, user[a], item, r, a, b)
                        k += 1
                    seen += 1
        else:
            fa = np.empty(total, np.int64)
            fb = np.empty(total, np.int64)
            key = np.empty(total, np.float64)
            t = 0
            for a in range(lo, hi):
                for b in range(a + 1, hi):
                    if r[a] != r[b]:
                        fa[t] = a
                        fb[t] = b
                        key[t] = -abs(r[a] - r[b])
                        t += 1
            order = np.argsort(np.random.random(total))          # random tie-break ...
            order = order[np.argsort(key[order], kind="mergesort")]  # ... then largest gap
            chosen = np.sort(order[:want])
            for c in chosen:
                _write(out, k, user[lo], item, r, fa[c], fb[c])
                k += 1
