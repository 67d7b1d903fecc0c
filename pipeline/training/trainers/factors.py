"""A model's factors ``(U, V, b)`` as the AltSVM trainer, its challengers and blends score
them: of a fitted estimator or plain arrays (:func:`factors_of`), scored for given (user, item)
pairs (:func:`pair_scores`), and keyed by content (:func:`content_key`)."""

from __future__ import annotations

import zlib

import numpy as np
import scipy.sparse as sp


def factors_of(scorer) -> tuple:
    """``(U, V, b or None)`` of a fitted AltSVM, of factors, or of one score per item (then
    U is a single row of ones, the same list for everyone)."""
    if isinstance(scorer, np.ndarray):
        return (np.ones((1, 1), np.float32), scorer.reshape(-1, 1).astype(np.float32), None)
    if isinstance(scorer, tuple):
        return scorer
    return (scorer.user_factors_, scorer.item_factors_,
            scorer.item_bias_ if scorer.item_bias else None)


def content_key(a) -> tuple | None:
    """Shape, dtype and CRC-32 of an array's bytes (None for None): equal for equal contents."""
    if a is None:
        return None
    if sp.issparse(a):      # an item-kNN's factors: their CSR arrays
        a = a.tocsr()
        return (a.shape, *(content_key(x) for x in (a.data, a.indices, a.indptr)))
    a = np.ascontiguousarray(a)
    return a.shape, a.dtype.str, zlib.crc32(a.view(np.uint8).reshape(-1))


def csr_rows(users, items, n_users):
    """``(indptr, items by user)``: the CSR rows of (user, item) pairs."""
    order = np.argsort(users, kind="stable")
    return np.r_[0, np.cumsum(np.bincount(users, minlength=n_users))], items[order]


# BLAS multiply-adds that cost as much as one number gathered from random rows: 65-670 on the
# 2 cores (memory-bound gathers, against 75 GFLOP/s of BLAS), by rank 20 to 3,600
GATHER_COST = 100


def pair_scores(U, V, b, users, items, block: int = 1 << 22) -> np.ndarray:
    """``U[u]·V[i] (+ b[i])`` of each (user, item) pair, by whichever way costs less: gathering
    both factors of every pair (pairs x rank numbers moved, each costing about ``GATHER_COST``
    multiply-adds), or the users' whole score rows by BLAS (users x items x rank
    multiply-adds), ``block`` numbers at a time either way. An item-item model's factors are
    as wide as the catalogue: MovieLens's 100k rated pairs cost less as its 943 x 1,682 score
    rows, while a blend's 4,096 sampled pairs over ml-1m's 3.6k users and items took 1.7 s of
    a warm retrain that way."""
    users, items = np.asarray(users, np.int64), np.asarray(items, np.int64)
    wanted = np.unique(users)
    if sp.issparse(U) or sp.issparse(V):      # an item-kNN's (or its blend's): sparse rows
        U, V = sp.csr_matrix(U), sp.csr_matrix(V)
        s = np.asarray(U[users].multiply(V[items]).sum(axis=1)).ravel()
        return s if b is None else s + b[items]
    if len(users) * GATHER_COST <= len(wanted) * V.shape[0]:
        step = max(1, block // max(U.shape[1], 1))
        s = np.concatenate([np.einsum("ij,ij->i", U[users[lo:lo + step]], V[items[lo:lo + step]])
                            for lo in range(0, len(users), step)] or [np.zeros(0)])
        return s if b is None else s + b[items]
    out = np.empty(len(users), np.result_type(U, V))
    order = np.argsort(users, kind="stable")
    ends = np.searchsorted(users[order], wanted, side="right")
    step = max(1, block // max(V.shape[0], 1))
    for lo in range(0, len(wanted), step):
        rows = U[wanted[lo:lo + step]] @ V.T         # (users in the block) x items
        first = 0 if lo == 0 else ends[lo - 1]
        at = order[first:ends[min(lo + step, len(wanted)) - 1]]
        out[at] = rows[np.searchsorted(wanted[lo:lo + step], users[at]), items[at]]
    return out if b is None else out + b[items]
