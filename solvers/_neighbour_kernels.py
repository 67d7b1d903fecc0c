"""Numba kernel of :mod:`solvers.neighbours`: each item's ``k`` most similar items from one
block of co-occurrence rows, ranked in place of a global sort (a ``np.lexsort`` of every
co-occurrence by three keys was 3.3 of 5.4 s per shrinkage on 21M co-occurrences)."""

from __future__ import annotations

import numba as nb
import numpy as np


@nb.njit(cache=True, nogil=True, parallel=True)
def block_neighbours(indptr, indices, data, norm, start, shrink, offsets, nbr, item, sim,
                     position):
    """Row r of the CSR (``indptr``, ``indices`` distinct within a row, in any order,
    ``data``) holds the co-occurrence counts c_ij of item j = ``start`` + r with every item i;
    its other items ranked by c_ij / (‖i‖‖j‖ + ``shrink``) descending, then by lower index (a
    stable sort of the row put in index order here, in parallel: scipy's ``sort_indices`` was
    a serial 0.5 s per shrinkage on 21M co-occurrences), fill ``offsets[r]:offsets[r + 1]``
    of the outputs (the first that many of them; ``position`` 0.. within the row). Rows are
    independent: the same output on any number of threads."""
    for r in nb.prange(indptr.shape[0] - 1):
        j = start + r
        lo, hi = indptr[r], indptr[r + 1]
        take = offsets[r + 1] - offsets[r]
        if take == 0:
            continue
        negative = np.empty(hi - lo, np.float64)
        cols = np.empty(hi - lo, np.int32)
        n = 0
        for p in lo + np.argsort(indices[lo:hi]):     # in index order
            i = indices[p]
            if i != j:
                negative[n] = -(np.float64(data[p]) / (norm[i] * norm[j] + shrink))
                cols[n] = i
                n += 1
        order = np.argsort(negative[:n], kind="mergesort")
        o = offsets[r]
        for q in range(take):
            t = order[q]
            nbr[o + q] = cols[t]
            item[o + q] = j
            sim[o + q] = np.float32(-negative[t])
            position[o + q] = q
