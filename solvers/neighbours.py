"""Item-item neighbours of binary interaction data: cosine similarity with shrinkage, each
item's ``k`` most similar items kept (the item-kNN of Sarwar et al. 2001; shrinkage as in
Koren 2008 and Dacrema et al. 2019's tuned baseline).

With X the binary users x items matrix and ``c_ij = |users of i ∩ users of j|``::

    sim(i, j) = c_ij / (sqrt(c_ii · c_jj) + shrink)

A user u's score for item j is ``Σ_{i ∈ items of u} sim(i, j)`` over the i among j's ``k``
neighbours: with ``V`` the items x items CSR whose row j holds j's neighbours, the scores are
``X Vᵀ``, a factor model whose user rows are the users' 0/1 items and whose item rows are
sparse. Memory is the kept neighbours (8 bytes each per shrinkage while they are ranked, 16
while they are handed out, 8 in ``V``: at most ``k`` per item) plus a row of counts of the
catalogue per thread, never the items x items matrix; time is the co-occurrences' count
(Σ over users of their item count squared), counted once for every shrinkage, on every
thread (:mod:`solvers._neighbour_kernels`).

Order: a neighbour list ranks by similarity, then by lower item index (the same on any number
of threads).

>>> import scipy.sparse as sp
>>> X = sp.csr_matrix(np.array([[1, 1, 0], [1, 1, 1], [0, 0, 1]], np.float32))
>>> V = neighbour_rows(cosine_neighbours(X, (0.0,), 1)[0.0], 3, 1)
>>> V.toarray().round(3).tolist()
[[0.0, 1.0, 0.0], [1.0, 0.0, 0.0], [0.5, 0.0, 0.0]]
"""

from __future__ import annotations

import numpy as np
import scipy.sparse as sp

from solvers._neighbour_kernels import item_neighbours

__all__ = ["cosine_neighbours", "neighbour_rows", "warm_up"]


def cosine_neighbours(X, shrinks, k_max: int) -> dict:
    """Per shrinkage ``s`` of ``shrinks``, every item's ``k_max`` most similar other items
    (see the module): ``{s: (neighbour, item, similarity, position)}``, flat arrays with
    ``position`` 0.. within each item's ranked list; items in increasing order. ``X``: a
    binary (or 0/1-valued) sparse users x items matrix. Every shrinkage is ranked from one
    count of the co-occurrences (the costly part)."""
    import numba

    if int(k_max) < 1:
        raise ValueError(f"k_max is {k_max!r}, expected at least 1")
    shrinks = [float(s) for s in shrinks]
    if any(not np.isfinite(s) or s < 0 for s in shrinks):
        raise ValueError(f"shrinks are {shrinks}, expected finite values >= 0")
    X = sp.csr_matrix(X, dtype=np.float32)
    if not X.has_canonical_format:      # a repeated entry would count its user twice
        X = X.copy()
        X.sum_duplicates()
    n_items = X.shape[1]
    XT = sp.csr_matrix(X.T)                 # items x users
    norm = np.sqrt(np.diff(XT.indptr).astype(np.float64))
    # a slot per item as long as its list can be: k_max, or the other items its users met
    others = XT @ np.maximum(np.diff(X.indptr) - 1, 0).astype(np.float64)
    slot_ptr = np.zeros(n_items + 1, np.int64)
    np.cumsum(np.minimum(np.minimum(others, n_items - 1), int(k_max)).astype(np.int64),
              out=slot_ptr[1:])
    nbr = np.empty((len(shrinks), slot_ptr[-1]), np.int32)
    sim = np.empty((len(shrinks), slot_ptr[-1]), np.float32)
    taken = np.zeros(n_items, np.int64)
    spans = max(1, min(4 * numba.get_num_threads(), n_items))
    item_neighbours(*(np.ascontiguousarray(a, np.int32) for a in (
        X.indptr, X.indices, XT.indptr, XT.indices)), norm, np.asarray(shrinks, np.float64),
        int(k_max), slot_ptr, spans, nbr, sim, taken)
    item = np.repeat(np.arange(n_items, dtype=np.int32), np.diff(slot_ptr))
    position = (np.arange(slot_ptr[-1], dtype=np.int64) - slot_ptr[:-1][item]).astype(np.int32)
    keep = position < taken[item]
    return {s: (nbr[x][keep], item[keep], sim[x][keep], position[keep])
            for x, s in enumerate(shrinks)}


def warm_up() -> float:
    """Compile, or load from numba's disk cache, :func:`cosine_neighbours`' kernel; returns
    the seconds.

    >>> seconds = warm_up()
    """
    import time

    started = time.perf_counter()
    cosine_neighbours(sp.csr_matrix(np.eye(3, dtype=np.float32)), (0.0,), 1)
    return time.perf_counter() - started


def neighbour_rows(candidates: tuple, n_items: int, k: int) -> sp.csr_matrix:
    """The items x items float32 CSR ``V`` whose row j holds j's first ``k`` neighbours of
    ``candidates`` (one entry of :func:`cosine_neighbours`) with their similarities: scores
    ``X Vᵀ``."""
    nbr, items, sim, position = candidates
    keep = position < int(k)
    V = sp.csr_matrix((sim[keep], (items[keep], nbr[keep])), shape=(n_items, n_items),
                      dtype=np.float32)
    V.sort_indices()
    return V
