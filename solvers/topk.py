"""Exact top-K lists: per user from factors (blocked BLAS matmul + a jitted selection kernel,
run in threads), and for single score vectors (numpy only). The one top-K of the project:
``AltSVM.recommend``, the publisher's precomputed lists and the lookup client's on-demand
scoring all go through here, so they agree item for item.

Order everywhere: descending score, equal scores by lower item index first, i.e. the first
``k`` of ``np.argsort(-scores, kind="stable")``; -inf and NaN never rank (-inf marks an
excluded item).

Examples
--------
>>> import numpy as np
>>> topk_of_scores(np.array([0.5, 2.0, -1.0, 2.0], dtype=np.float32), 3)
(array([1, 3, 0]), array([2. , 2. , 0.5], dtype=float32))
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import nullcontext
from dataclasses import dataclass

import numpy as np


def topk_of_scores(scores: np.ndarray, k: int, exclude=None) -> tuple[np.ndarray, np.ndarray]:
    """Top ``k`` (indices, scores) of one score vector, skipping ``exclude`` indices.

    Examples
    --------
    >>> import numpy as np
    >>> topk_of_scores(np.array([3.0, 1.0, 2.0]), 2, exclude=[0])
    (array([2, 1]), array([2., 1.]))
    """
    scores = np.asarray(scores)
    if exclude is not None and len(exclude):
        scores = scores.copy()
        scores[np.asarray(exclude, dtype=np.intp)] = -np.inf
    n = len(scores)
    if k <= 0:
        return np.zeros(0, np.intp), scores[:0]
    if k < n:
        # the k-th largest by one partition of the whole vector (NaN sorts last). With m NaNs
        # it is the (k - m)-th largest, and the entries above it plus its ties fall short of
        # k unless the ties fill the list exactly as the full path would; short: full path
        kth = np.partition(scores, n - k)[n - k]
        if kth > -np.inf:
            above = np.flatnonzero(scores > kth)
            ties = np.flatnonzero(scores == kth)[: k - len(above)]
            if len(above) + len(ties) == k:
                valid = np.concatenate([above, ties])
                order = valid[np.lexsort((valid, -scores[valid]))]
                return order, scores[order]
    valid = np.flatnonzero(scores > -np.inf)  # also drops NaN
    if len(valid) > k:
        vals = scores[valid]
        kth = np.partition(vals, len(vals) - k)[len(vals) - k]
        above = valid[vals > kth]
        ties = valid[vals == kth][: k - len(above)]
        valid = np.concatenate([above, ties])
    order = valid[np.lexsort((valid, -scores[valid]))] if len(valid) else valid
    return order, scores[order]


SMALL = 2_000_000  # users x items below which plain numpy selects the top K
SPARSE_COLUMNS = 1 / 32  # user factor columns at most this dense are multiplied sparsely,
SPARSE_WIDTH = 256       # when there are at least this many of them


def dense_pairs(U: np.ndarray, VT: np.ndarray) -> list[tuple]:
    """``U @ VT`` as :func:`factor_pairs`' sum of products for dense factors: one dense pair,
    with the columns of ``U`` that are mostly zeros split off as a CSR pair when there are at
    least :data:`SPARSE_WIDTH` of them. An item-item model's user rows are the user's 0/1 met
    items (EASE's: hundreds to thousands of columns with a handful set), alone or in a blend
    (``[a U₁ | b X]``); their scores then cost nnz(X) x items instead of users x columns x
    items: on amazon-beauty (6 items per user, EASE 823 columns wide) 137x fewer
    multiply-adds; publishing a blend of a rank-20 model and a 647-column EASE to 40k users
    over 39k items, 8.6 s as one dense product. The sums skip the zero terms, so a score may
    differ from the dense product in its last bit."""
    if U.ndim != 2 or U.shape[1] < SPARSE_WIDTH or U.shape[0] == 0:
        return [(U, VT)]
    thin = np.count_nonzero(U, axis=0) <= SPARSE_COLUMNS * U.shape[0]
    if thin.sum() < SPARSE_WIDTH:
        return [(U, VT)]
    from scipy.sparse import csr_matrix

    if thin.all():
        return [(csr_matrix(U), _thin_rows(VT))]
    dense, sparse = np.flatnonzero(~thin), np.flatnonzero(thin)
    if sparse[-1] - sparse[0] == len(sparse) - 1:   # a blend's: one run of columns, VT's rows
        sparse = slice(int(sparse[0]), int(sparse[-1]) + 1)   # viewed, not copied
    return [(np.ascontiguousarray(U[:, dense]), np.ascontiguousarray(VT[dense])),
            (csr_matrix(U)[:, sparse], _thin_rows(VT[sparse]))]


def _thin_rows(VT: np.ndarray):
    """``VT`` as CSR where at most :data:`SPARSE_COLUMNS` of it is set (EASE on a large
    catalogue's most-met items: its 647 rows of 39k items hold 647 weights each), so a sparse
    user row's scores cost its nonzeros x theirs, not x items (the same sums: zero terms
    skipped); else as it is."""
    if np.count_nonzero(VT) > SPARSE_COLUMNS * VT.size:
        return VT
    from scipy.sparse import csr_matrix

    return csr_matrix(VT)


def factor_scores(U, rows: slice, VT, out: np.ndarray) -> np.ndarray:
    """``U[rows] @ VT`` into ``out``: ``U`` a dense array or a CSR matrix (:func:`dense_pairs`,
    an item-kNN's 0/1 rows), ``VT`` a dense array or a sparse matrix (an item-kNN's
    neighbours: :mod:`solvers.neighbours`)."""
    if isinstance(U, np.ndarray) and isinstance(VT, np.ndarray):
        return np.matmul(U[rows], VT, out=out)
    out[:] = 0.0
    return _add_product(U, rows, VT, out)


def _add_product(U, rows: slice, VT, out: np.ndarray) -> np.ndarray:
    """``out += U[rows] @ VT``; a CSR ``U`` past :data:`SMALL` scores is multiplied by a
    kernel into ``out`` (scipy's sums, bit for bit, without its CSR product or the GIL)."""
    import scipy.sparse as sp

    if sp.isspmatrix_csr(U) and out.size > SMALL:
        from solvers._topk_kernels import sparse_dense_add, sparse_product_add

        rows_of_u = (U.indptr.astype(np.int64, copy=False), U.indices, U.data)
        if sp.isspmatrix_csr(VT):
            sparse_product_add(*rows_of_u, VT.indptr.astype(np.int64, copy=False),
                               VT.indices, VT.data, rows.start, out)
            return out
        if isinstance(VT, np.ndarray) and VT.dtype == np.float32 and U.dtype == np.float32:
            sparse_dense_add(*rows_of_u, np.ascontiguousarray(VT), rows.start, out)
            return out
    product = U[rows] @ VT
    out += product.toarray() if hasattr(product, "toarray") else product
    return out


def factor_pairs(U, V) -> list[tuple]:
    """``U Vᵀ`` as a sum of products ``[(U_k, V_kᵀ), ...]`` to take by blocks of rows
    (:func:`pairs_scores`): one dense pair for dense factors; for sparse ones (an item-kNN's,
    or a blend with one: ``[a U₁ | b X]`` against ``[V₁ | V_knn]``) the columns of V set for
    most items as a dense pair (BLAS) and the rest as a sparse one. Multiplied as one sparse
    product, a blend's dense columns made every block's product a dense matrix built entry by
    entry: on amazon-beauty, minutes."""
    import scipy.sparse as sp

    if not sp.issparse(U) and not sp.issparse(V):
        return dense_pairs(U, np.ascontiguousarray(V.T))
    U, V = sp.csr_matrix(U), sp.csc_matrix(V)
    filled = np.diff(V.indptr) > V.shape[0] // 2
    pairs = []
    if filled.any():
        cols = np.flatnonzero(filled)
        pairs.append((np.ascontiguousarray(U[:, cols].toarray()),
                      np.ascontiguousarray(V[:, cols].toarray().T)))
    if not filled.all():
        cols = np.flatnonzero(~filled)
        pairs.append((U[:, cols].tocsr(), V[:, cols].T.tocsr()))
    return pairs


def pairs_scores(pairs: list, rows: slice, out: np.ndarray) -> np.ndarray:
    """The rows ``rows`` of the sum of :func:`factor_pairs`' products, into ``out``."""
    factor_scores(*pairs[0][:1], rows, pairs[0][1], out)
    for U, VT in pairs[1:]:
        _add_product(U, rows, VT, out)
    return out


def as_factors(a, name: str = "factors"):
    """``a`` as C-contiguous float32, or as a float32 CSR matrix when it is sparse (an
    item-kNN's factors: the users' 0/1 rows, the items' neighbour rows)."""
    import scipy.sparse as sp

    if sp.issparse(a):
        out = sp.csr_matrix(a, dtype=np.float32)
        if not np.isfinite(out.data).all():
            raise ValueError(f"{name} has {int((~np.isfinite(out.data)).sum())} non-finite "
                             "values")
        return out
    return np.ascontiguousarray(a, dtype=np.float32)


def _block_topk_numpy(scores, seen_indptr, seen_indices, row_offset, k, out_i, out_s, counts):
    """Same contract as ``solvers._topk_kernels.block_topk``, in numpy (small problems)."""
    for r in range(scores.shape[0]):
        u = row_offset + r
        idx, sc = topk_of_scores(scores[r], k, seen_indices[seen_indptr[u]:seen_indptr[u + 1]])
        counts[r] = len(idx)
        out_i[r, :len(idx)] = idx
        out_s[r, :len(idx)] = sc


@dataclass
class TopKBlock:
    """Top-K lists of the rows ``start:start+len(counts)`` of a user block."""

    start: int
    indices: np.ndarray  # (B, k) int32, valid up to counts[r]
    scores: np.ndarray  # (B, k) float32
    counts: np.ndarray  # (B,) int32


_CONTROLLER: list = []   # threadpoolctl's view of the loaded BLAS libraries, made once


def _blas_single_thread():
    # Each worker thread runs its own matmul; a multi-threaded BLAS on top of that only fights
    # the other workers for the cores (OpenBLAS threads spin after each call). The controller
    # is made once per process: making one reads /proc/self/maps, milliseconds that a caller
    # ranking one user at a time (the refresher) would pay on every call.
    if not _CONTROLLER:
        try:
            from threadpoolctl import ThreadpoolController
        except ImportError:  # optional: without it BLAS keeps its own threads
            return nullcontext()
        _CONTROLLER.append(ThreadpoolController())
    return _CONTROLLER[0].limit(limits=1, user_api="blas")


BLOCK_BYTES = 8 << 20   # a block's score rows: in cache while they are ranked


def block_rows(n_items: int) -> int:
    """Users per block of score rows: ``BLOCK_BYTES`` of them, 32 to 256 rows. The ranking
    reads each row once right after the product wrote it; on 39k items, 64-row blocks ranked
    10k users in 0.43 s against 0.55 s for 256 rows (the rows left the cache in between).

    >>> block_rows(1_682), block_rows(39_000), block_rows(1_000_000)
    (256, 53, 32)
    """
    return max(32, min(256, BLOCK_BYTES // (4 * max(int(n_items), 1))))


def user_topk_blocks(user_factors: np.ndarray, item_factors: np.ndarray, k: int, *,
                     item_bias: np.ndarray | None = None, seen_indptr: np.ndarray | None = None,
                     seen_indices: np.ndarray | None = None, block: int | None = None,
                     workers: int | None = None, jit: bool = False) -> Iterator[TopKBlock]:
    """Exact top-``k`` items of every user (score ``U @ V.T + b``, seen items excluded), in
    blocks of ``block`` users (default: :func:`block_rows`), in order.

    Work is split over ``workers`` threads (default: the CPU count); each computes its block's
    scores into a reused buffer with a single-threaded BLAS call and selects the top ``k`` in
    cache with a jitted kernel that releases the GIL (a small problem selects in numpy, unless
    ``jit``: a long-running caller has loaded the kernel once and saves the per-user loop).

    Examples
    --------
    >>> import numpy as np
    >>> U = np.eye(2, dtype=np.float32); V = np.array([[1, 0], [0, 1], [2, 0]], np.float32)
    >>> [b.indices[:, :2].tolist() for b in user_topk_blocks(U, V, 2)]
    [[[2, 0], [1, 0]]]
    """
    n_users = user_factors.shape[0]
    n_items = item_factors.shape[0]
    k = int(min(k, n_items))
    block = int(block or block_rows(n_items))
    U, V = as_factors(user_factors), as_factors(item_factors)
    bias = None if item_bias is None else np.asarray(item_bias, dtype=np.float32)
    if isinstance(U, np.ndarray) and isinstance(V, np.ndarray):
        VT = np.ascontiguousarray(V.T)
        U, VT, bias, unshift = _unit_scale(U, VT, bias)
        pairs = dense_pairs(U, VT) if n_users * n_items > SMALL else [(U, VT)]
    else:   # an item-kNN's or its blend's: similarities near 1, no tiny scale to mend
        pairs, unshift = factor_pairs(U, V), 0
    if seen_indptr is None:
        seen_indptr = np.zeros(n_users + 1, dtype=np.int64)
        seen_indices = np.zeros(0, dtype=np.int32)
    indptr = np.ascontiguousarray(seen_indptr, dtype=np.int64)
    indices = np.ascontiguousarray(seen_indices, dtype=np.int32)
    workers = max(1, workers or os.cpu_count() or 1)
    if n_users * n_items <= SMALL and not jit:  # not worth loading the jitted kernel (1 s)
        block_topk = _block_topk_numpy
        workers = 1
    else:
        from solvers._topk_kernels import block_topk, sparse_product_topk
    # an item-kNN's scores alone: each row's few nonzeros ranked where they are, never a
    # dense row (on amazon-beauty a row of 54k scores holds about 1,200)
    sparse_only = None      # or the CSR arrays of the two factors
    if (block_topk is not _block_topk_numpy and len(pairs) == 1 and bias is None
            and not isinstance(pairs[0][0], np.ndarray)
            and not isinstance(pairs[0][1], np.ndarray)):
        sparse_only = tuple(a for m in pairs[0] for a in (
            m.indptr.astype(np.int64, copy=False), m.indices, m.data))
    buffers: dict[int, np.ndarray] = {}

    def run(start: int) -> TopKBlock:
        import threading

        stop = min(start + block, n_users)
        out = TopKBlock(start, np.empty((stop - start, k), np.int32),
                        np.empty((stop - start, k), np.float32), np.empty(stop - start, np.int32))
        tid = threading.get_ident()
        buf = buffers.get(tid)
        if sparse_only:
            if buf is None:
                buf = buffers[tid] = np.zeros(n_items, np.int8)
            sparse_product_topk(*sparse_only, start, n_items, indptr, indices, k,
                                out.indices, out.scores, out.counts, buf)
            return out
        if buf is None:
            buf = buffers[tid] = np.empty((block, n_items), dtype=np.float32)
        scores = pairs_scores(pairs, slice(start, stop), buf[: stop - start])
        if bias is not None:
            scores += bias
        block_topk(scores, indptr, indices, start, k, out.indices, out.scores, out.counts)
        if unshift:
            out.scores[:] = np.ldexp(out.scores, unshift)
        return out

    starts = range(0, n_users, block)
    with _blas_single_thread():
        if workers == 1:
            yield from map(run, starts)
            return
        with ThreadPoolExecutor(workers, thread_name_prefix="topk") as pool:
            pending = []
            for start in starts:  # keep at most 2 blocks per worker in flight
                pending.append(pool.submit(run, start))
                if len(pending) >= 2 * workers:
                    yield pending.pop(0).result()
            for fut in pending:
                yield fut.result()


def _unit_scale(U, VT, bias, far: int = 16, room: int = 100):
    """``(U·2^a, Vᵀ·2^c, b·2^(a+c), −(a+c))``: factors scaled by powers of two to a largest
    magnitude near 1 when theirs is more than 2^±far away from it, else unchanged (shift 0).

    A power-of-two scale is exact, so every score is the same number times 2^(a+c): the same
    order, and the same scores once shifted back. It keeps the time of a top-K independent of
    the factors' scale: the products of a near-collapsed model's tiny factors would be
    subnormal floats, which many CPUs multiply and add tens of times slower (and with less
    precision). ``a`` is lowered so the bias stays below 2^room.

    >>> U, VT, b, shift = _unit_scale(np.full((1, 2), 2.0**-60, np.float32),
    ...                               np.full((2, 3), 2.0**-70, np.float32), None)
    >>> float(U.max()), float(VT.max()), shift
    (0.5, 0.5, -128)
    """
    def exponent(a):       # of the largest magnitude (max and -min: no |a| temporary)
        top = max(float(a.max()), -float(a.min())) if a is not None and a.size else 0.0
        return int(np.frexp(top)[1]) if top > 0 and np.isfinite(top) else None

    eu, ev = exponent(U), exponent(VT)
    if eu is None or ev is None or (abs(eu) <= far and abs(ev) <= far):
        return U, VT, bias, 0
    a, c = -eu, -ev
    eb = exponent(bias)
    if eb is not None and eb + a + c > room:
        a = room - eb - c
    U, VT = np.ldexp(U, a).astype(np.float32), np.ldexp(VT, c).astype(np.float32)
    if bias is not None:
        bias = np.ldexp(bias, a + c).astype(np.float32)
    return U, VT, bias, -(a + c)


def user_topk(user_factors: np.ndarray, item_factors: np.ndarray, k: int, *,
              item_bias: np.ndarray | None = None, seen_indptr: np.ndarray | None = None,
              seen_indices: np.ndarray | None = None,
              workers: int | None = None) -> tuple[np.ndarray, np.ndarray]:
    """:func:`user_topk_blocks` gathered into dense arrays: every user's top-``k`` item
    indices (int64, best first) and scores (float64); where fewer than ``k`` items remain
    after the seen ones, the tail is item -1 with score -inf.

    >>> import numpy as np
    >>> items, scores = user_topk(np.eye(2, dtype=np.float32),
    ...                           np.array([[1, 0], [0, 1]], np.float32), 3)
    >>> items.tolist(), float(scores[0, 2])
    ([[0, 1, -1], [1, 0, -1]], -inf)
    """
    n_users = user_factors.shape[0]
    items = np.full((n_users, k), -1, dtype=np.int64)
    scores = np.full((n_users, k), -np.inf)
    for blk in user_topk_blocks(user_factors, item_factors, k, item_bias=item_bias,
                                seen_indptr=seen_indptr, seen_indices=seen_indices,
                                workers=workers):
        rows = slice(blk.start, blk.start + blk.counts.shape[0])
        width = blk.indices.shape[1]
        valid = np.arange(width) < blk.counts[:, None]
        items[rows, :width] = np.where(valid, blk.indices, -1)
        scores[rows, :width] = np.where(valid, blk.scores, -np.inf)
    return items, scores


def global_topk(scores: np.ndarray, k: int, *, seen_indptr: np.ndarray,
                seen_indices: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """:func:`user_topk` of one score per item, the same for every user (a popularity or
    global list), each user's seen items excluded: the items are sorted once, then each
    user walks the order past their seen ones, O(k + seen) a user instead of a score per
    item (on amazon-beauty's 54k items and 47k users, 2.6 billion scores per list).
    Ties rank the lower index first, as :func:`user_topk` does.

    >>> items, _ = global_topk(np.array([1.0, 3.0, 2.0], np.float32), 2,
    ...                        seen_indptr=np.array([0, 1, 1]), seen_indices=np.array([1]))
    >>> items.tolist()
    [[2, 0], [1, 2]]
    """
    scores = np.asarray(scores, np.float32)
    order = np.argsort(-scores, kind="stable")
    order = order[np.isfinite(scores[order]) & (scores[order] > -np.inf)]
    from solvers._topk_kernels import global_rows

    items = np.full((len(seen_indptr) - 1, k), -1, dtype=np.int64)
    global_rows(np.asarray(order, np.int64), np.asarray(seen_indptr, np.int64),
                np.asarray(seen_indices, np.int64), int(k), np.zeros(len(scores), np.int8),
                items)
    out = np.where(items >= 0, scores[np.maximum(items, 0)].astype(np.float64), -np.inf)
    return items, out


def warm_up() -> float:
    """Compile (or load from cache) the selection kernel, so timings exclude it; returns the
    seconds."""
    import time

    from solvers._topk_kernels import (
        block_topk,
        sparse_dense_add,
        sparse_product_add,
        sparse_product_topk,
    )

    started = time.perf_counter()
    scores = np.ones((1, 2), np.float32)
    out = (np.empty((1, 1), np.int32), np.empty((1, 1), np.float32), np.empty(1, np.int32))
    block_topk(scores, np.zeros(2, np.int64), np.zeros(0, np.int32), 0, 1, *out)
    one = (np.array([0, 1], np.int64), np.array([0], np.int32), np.ones(1, np.float32))
    sparse_product_topk(*one, *one, 0, 1, np.zeros(2, np.int64), np.zeros(0, np.int32), 1,
                        *out, np.zeros(1, np.int8))
    sparse_product_add(*one, *one, 0, scores)
    sparse_dense_add(*one, scores, 0, scores.copy())
    global_topk(np.ones(2, np.float32), 1, seen_indptr=np.zeros(2, np.int64),
                seen_indices=np.zeros(0, np.int64))
    return time.perf_counter() - started
