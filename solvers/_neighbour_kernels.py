"""Numba kernel of :mod:`solvers.neighbours`: each item's ``k`` most similar items, its
co-occurrences counted and ranked in one GIL-free pass per item (a scipy product of a block of
item rows held the GIL and was serial: 2.0 s per shrinkage on synthetic-1m's 726k rows, where
this takes a fraction on two threads).

Per item j: every user u of j adds 1 to ``count[i]`` for each other item i of u (a dense
scratch row of the catalogue, one per thread, reset through the list of items it touched),
so ``count[i] = c_ij``; then, per shrinkage, the items are ranked by
``c_ij / (‖i‖‖j‖ + shrink)`` descending, then by lower index. The ranking selects instead of
sorting the row (:func:`_best`): only the best ``take`` are sorted. Items are independent, so
the output is the same on any number of threads.
"""

from __future__ import annotations

import numba as nb
import numpy as np

CHUNK = 32      # entries of a row per chunk maximum (:func:`_best`)


@nb.njit(cache=True, nogil=True)
def _best(sims, touched, take):
    """The positions in ``sims`` of its ``take`` best entries, ranked by similarity descending,
    then by lower item (``touched[position]``). A threshold first, as in
    :mod:`solvers._topk_kernels`: the take-th largest of the row's chunk maxima is one that at
    least ``take`` entries reach, so only the chunks whose maximum reaches it are read again."""
    m = sims.shape[0]
    n_chunks = (m + CHUNK - 1) // CHUNK
    if n_chunks >= 4 * take:        # else a threshold would leave most of the row to read
        maxima = np.empty(n_chunks, np.float64)
        for c in range(n_chunks):
            top = -np.inf
            for a in range(c * CHUNK, min(m, (c + 1) * CHUNK)):
                top = max(top, sims[a])
            maxima[c] = top
        floor = np.partition(maxima, n_chunks - take)[n_chunks - take]
        n = 0
        for c in range(n_chunks):
            if maxima[c] >= floor:
                for a in range(c * CHUNK, min(m, (c + 1) * CHUNK)):
                    n += sims[a] >= floor
        cand = np.empty(n, np.int64)
        n = 0
        for c in range(n_chunks):
            if maxima[c] >= floor:
                for a in range(c * CHUNK, min(m, (c + 1) * CHUNK)):
                    if sims[a] >= floor:
                        cand[n] = a
                        n += 1
    else:
        cand = np.arange(m)
    values = sims[cand]
    if cand.shape[0] > take:        # exactly: those past the take-th value, then its ties
        kth = np.partition(values, cand.shape[0] - take)[cand.shape[0] - take]
        ties = cand[values == kth]
        # the ties of lower item first, as many as are left
        ties = ties[np.argsort(touched[ties])[:take - int((values > kth).sum())]]
        cand = np.concatenate((cand[values > kth], ties))
    cand = cand[np.argsort(touched[cand])]                      # items distinct: any sort
    return cand[np.argsort(-sims[cand], kind="mergesort")]      # stable: ties by lower item


@nb.njit(cache=True, nogil=True)
def _item_neighbours(j, x_indptr, x_indices, xt_indptr, xt_indices, norm, shrinks, k_max,
                     slot, count, touched, nbr, sim):
    """Item ``j``'s ranked neighbours per shrinkage into ``nbr[s, slot:]`` / ``sim[s, slot:]``;
    returns how many (at most ``k_max``). ``count`` is all zeros on entry and on return."""
    m = 0
    for p in range(xt_indptr[j], xt_indptr[j + 1]):
        u = xt_indices[p]
        for q in range(x_indptr[u], x_indptr[u + 1]):
            i = x_indices[q]
            if i != j:
                if count[i] == 0:
                    touched[m] = i
                    m += 1
                count[i] += 1
    take = min(m, k_max)
    sims = np.empty(m, np.float64)
    for s in range(shrinks.shape[0] if take > 0 else 0):
        for a in range(m):
            i = touched[a]
            sims[a] = np.float64(count[i]) / (norm[i] * norm[j] + shrinks[s])
        ranked = _best(sims, touched[:m], take)
        for q in range(take):
            nbr[s, slot + q] = touched[ranked[q]]
            sim[s, slot + q] = np.float32(sims[ranked[q]])
    for a in range(m):
        count[touched[a]] = 0
    return take


@nb.njit(cache=True, nogil=True)
def _span(t, n_spans, x_indptr, x_indices, xt_indptr, xt_indices, norm, shrinks, k_max,
          slot_ptr, nbr, sim, taken):
    """Items t, t + n_spans, ... (strided: popular items spread over the threads)."""
    n_items = xt_indptr.shape[0] - 1
    count = np.zeros(n_items, np.int32)
    touched = np.empty(n_items, np.int32)
    for j in range(t, n_items, n_spans):
        taken[j] = _item_neighbours(j, x_indptr, x_indices, xt_indptr, xt_indices, norm,
                                    shrinks, k_max, slot_ptr[j], count, touched, nbr, sim)


@nb.njit(cache=True, nogil=True, parallel=True)
def item_neighbours(x_indptr, x_indices, xt_indptr, xt_indices, norm, shrinks, k_max, slot_ptr,
                    n_spans, nbr, sim, taken):
    """Every item j's neighbours ranked (see the module) per shrinkage s into
    ``nbr[s, slot_ptr[j]:]`` and ``sim[s, slot_ptr[j]:]``, their count into ``taken[j]`` (at
    most ``k_max`` and the slot's length). X is the binary users x items CSR (``x_*``), XT its
    transpose (``xt_*``), ``norm`` the items' sqrt(c_jj)."""
    for t in nb.prange(n_spans):
        _span(t, n_spans, x_indptr, x_indices, xt_indptr, xt_indices, norm, shrinks, k_max,
              slot_ptr, nbr, sim, taken)
