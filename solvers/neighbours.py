"""Item-item neighbours of binary interaction data: cosine similarity with shrinkage, each
item's ``k`` most similar items kept (the item-kNN of Sarwar et al. 2001; shrinkage as in
Koren 2008 and Dacrema et al. 2019's tuned baseline).

With X the binary users x items matrix and ``c_ij = |users of i ∩ users of j|``::

    sim(i, j) = c_ij / (sqrt(c_ii · c_jj) + shrink)

A user u's score for item j is ``Σ_{i ∈ items of u} sim(i, j)`` over the i among j's ``k``
neighbours: with ``V`` the items x items CSR whose row j holds j's neighbours, the scores are
``X Vᵀ``, a factor model whose user rows are the users' 0/1 items and whose item rows are
sparse. Memory is the kept neighbours (16 bytes each per shrinkage while they are ranked, 8
in ``V``: at most ``k`` per item) plus one block of
items' co-occurrences at a time (:data:`BLOCK_ENTRIES` bounds the block's dense width), never
the items x items matrix.

Order: a neighbour list ranks by similarity, then by lower item index (reproducible whatever
the order scipy's product returns its entries in).

>>> import scipy.sparse as sp
>>> X = sp.csr_matrix(np.array([[1, 1, 0], [1, 1, 1], [0, 0, 1]], np.float32))
>>> V = neighbour_rows(cosine_neighbours(X, (0.0,), 1)[0.0], 3, 1)
>>> V.toarray().round(3).tolist()
[[0.0, 1.0, 0.0], [1.0, 0.0, 0.0], [0.5, 0.0, 0.0]]
"""

from __future__ import annotations

import numpy as np
import scipy.sparse as sp

from solvers._neighbour_kernels import block_neighbours

__all__ = ["cosine_neighbours", "neighbour_rows", "warm_up"]

# co-occurrences (block rows x items) formed at a time, at most: each is a CSR entry (8 bytes)
# plus scipy's product's temporaries while its block is ranked (on ml-1m-implicit's 3.6k items,
# 20M of them made a block the whole matrix and 0.5 GB of a 2.1 GB run)
BLOCK_ENTRIES = 4_000_000


def cosine_neighbours(X, shrinks, k_max: int) -> dict:
    """Per shrinkage ``s`` of ``shrinks``, every item's ``k_max`` most similar other items
    (see the module): ``{s: (neighbour, item, similarity, position)}``, flat arrays with
    ``position`` 0.. within each item's ranked list; items in increasing order. ``X``: a
    binary (or 0/1-valued) sparse users x items matrix."""
    if int(k_max) < 1:
        raise ValueError(f"k_max is {k_max!r}, expected at least 1")
    shrinks = [float(s) for s in shrinks]
    if any(not np.isfinite(s) or s < 0 for s in shrinks):
        raise ValueError(f"shrinks are {shrinks}, expected finite values >= 0")
    X = sp.csr_matrix(X, dtype=np.float32)
    X.data[:] = 1.0
    n_items = X.shape[1]
    XT = sp.csr_matrix(X.T)                 # items x users
    norm = np.sqrt(np.diff(XT.indptr).astype(np.float64))
    block = max(16, int(BLOCK_ENTRIES // max(n_items, 1)))
    kept: dict = {s: [] for s in shrinks}
    for start in range(0, n_items, block):
        stop = min(start + block, n_items)
        co = XT[start:stop] @ X             # row r: item start + r's co-occurrences
        # every item met by someone co-occurs with itself, which is never its neighbour
        others = np.diff(co.indptr) - (norm[start:stop] > 0)
        offsets = np.zeros(stop - start + 1, np.int64)
        np.cumsum(np.minimum(others, k_max), out=offsets[1:])
        indptr = co.indptr.astype(np.int64)
        indices = co.indices.astype(np.int32, copy=False)
        for s in shrinks:
            # 16 bytes per kept neighbour and shrinkage
            out = (np.empty(offsets[-1], np.int32), np.empty(offsets[-1], np.int32),
                   np.empty(offsets[-1], np.float32), np.empty(offsets[-1], np.int32))
            block_neighbours(indptr, indices, co.data, norm, start, s, offsets, *out)
            kept[s].append(out)
    empty = (np.zeros(0, np.int32),) * 2 + (np.zeros(0, np.float32), np.zeros(0, np.int32))
    return {s: tuple(np.concatenate(p) for p in zip(*parts)) if parts else empty
            for s, parts in kept.items()}


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
