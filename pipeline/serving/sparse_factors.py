"""Sparse factors on the wire: a ``user_item`` version whose factors are CSR matrices (an
item-kNN's: each user's row their 0/1 met items, each item's row its neighbours; or a blend
with one) has meta ``factor_format = csr`` and stores (``REDIS_LAYOUT.md``)

* an item chunk ``V:<c>`` as the int32 count of each of its rows, then the rows' entries as
  (int32 column, float32 value) pairs (:data:`~pipeline.serving.layout.PAIR_DTYPE`), row by
  row: ``4 · rows + 8 · entries`` bytes;
* a user factor ``u:<user>`` as that user's (column, value) pairs: ``8 · entries`` bytes.

A reader turns a user factor into a dense vector of the version's rank (``rank`` floats per
request, as a dense version's factor is) and keeps the item rows as one CSR matrix, so
``V @ u`` is one sparse product either way.

>>> import scipy.sparse as sp
>>> V = sp.csr_matrix(np.array([[0, 2, 0], [1, 0, 3]], np.float32))
>>> back = unpack_rows(pack_rows(V, 0, 2), "V:0", 2, 3)
>>> back.toarray().tolist()
[[0.0, 2.0, 0.0], [1.0, 0.0, 3.0]]
>>> unpack_factor(pack_factor(V[1], sparse=True), "u:x", 3, sparse=True).tolist()
[1.0, 0.0, 3.0]
"""

from __future__ import annotations

import numpy as np
import scipy.sparse as sp

from pipeline.serving.layout import PAIR_DTYPE, LayoutError, pack_f32, pack_pairs, unpack_f32

CSR = "csr"      # the meta's factor_format of a version with sparse factors (absent: dense)


def is_sparse(meta: dict) -> bool:
    """Whether a version's factors are stored sparsely (its meta's ``factor_format``)."""
    return meta.get("factor_format", "dense") == CSR


def row_bytes(V) -> int:
    """The most bytes one item row takes in a chunk (dense: ``4 · rank``)."""
    if sp.issparse(V):
        counts = np.diff(V.indptr)
        return 4 + 8 * int(counts.max() if len(counts) else 0)
    return 4 * V.shape[1]


def pack_rows(V: sp.csr_matrix, lo: int, hi: int) -> bytes:
    """Rows ``lo:hi`` of ``V``: their counts, then their (column, value) pairs."""
    a, b = int(V.indptr[lo]), int(V.indptr[hi])
    counts = np.diff(V.indptr[lo:hi + 1]).astype("<i4")
    return counts.tobytes() + pack_pairs(V.indices[a:b], V.data[a:b])


def unpack_rows(value: bytes, key: str, n_rows: int, n_cols: int) -> sp.csr_matrix:
    """Inverse of :func:`pack_rows`, checked (length, counts, column range)."""
    head = 4 * n_rows
    if not isinstance(value, bytes) or len(value) < head or (len(value) - head) % 8:
        raise LayoutError(f"{key} holds {len(value) if isinstance(value, bytes) else '?'} "
                          f"bytes, expected {n_rows} int32 row counts and then (int32, float32) "
                          "pairs")
    counts = np.frombuffer(value, "<i4", n_rows).astype(np.int64)
    pairs = np.frombuffer(value, PAIR_DTYPE, offset=head)
    if (counts < 0).any() or int(counts.sum()) != len(pairs):
        raise LayoutError(f"{key}: its row counts sum to {int(counts.sum())}, it holds "
                          f"{len(pairs)} entries")
    cols = pairs["index"]
    if len(cols) and (cols.min() < 0 or cols.max() >= n_cols):
        raise LayoutError(f"{key} names column {int(cols.max())} or {int(cols.min())}, the "
                          f"version has rank {n_cols}")
    indptr = np.concatenate([[0], np.cumsum(counts)])
    return sp.csr_matrix((pairs["score"].astype(np.float32), cols.astype(np.int32), indptr),
                         shape=(n_rows, n_cols))


def pack_factor(u, *, sparse: bool) -> bytes:
    """One user factor's value: float32s, or (for a sparse version) the pairs of its nonzero
    entries (``u`` a dense vector or a 1-row sparse matrix)."""
    if not sparse:
        return pack_f32(u.toarray().ravel() if sp.issparse(u) else u)
    if sp.issparse(u):
        row = sp.csr_matrix(u)
        return pack_pairs(row.indices, row.data)
    u = np.asarray(u, np.float32).ravel()
    nz = np.flatnonzero(u)
    return pack_pairs(nz, u[nz])


def unpack_factor(raw: bytes, key: str, rank: int, *, sparse: bool) -> np.ndarray:
    """A user factor as a dense float32 vector of ``rank`` values."""
    if not sparse:
        u = unpack_f32(raw, key)
        if u.shape != (rank,):
            raise LayoutError(f"{key} holds {u.size} floats, the version has rank {rank}")
        return u
    if not isinstance(raw, bytes) or len(raw) % PAIR_DTYPE.itemsize:
        raise LayoutError(f"{key} is not (int32 column, float32 value) pairs")
    pairs = np.frombuffer(raw, PAIR_DTYPE)
    cols = pairs["index"]
    if len(cols) and (cols.min() < 0 or cols.max() >= rank):
        raise LayoutError(f"{key} names column {int(cols.max())} or {int(cols.min())}, the "
                          f"version has rank {rank}")
    u = np.zeros(rank, np.float32)
    u[cols] = pairs["score"]
    return u


def dense_row(V, i: int) -> np.ndarray:
    """Row ``i`` of item factors, dense (float64), sparse or not."""
    row = V[i]
    return np.asarray(row.toarray() if sp.issparse(row) else row, np.float64).ravel()


def unit_rows(V):
    """``V`` with rows scaled to unit length (zero rows stay zero), sparse or not."""
    if sp.issparse(V):
        norms = np.sqrt(np.asarray(V.multiply(V).sum(axis=1)).ravel())
        return sp.csr_matrix(sp.diags(1.0 / np.where(norms > 0, norms, 1.0)) @ V,
                             dtype=np.float32)
    norms = np.linalg.norm(V, axis=1, keepdims=True)
    return (V / np.where(norms > 0, norms, 1.0)).astype(np.float32)


def scores_of(V, u) -> np.ndarray:
    """``V @ u`` as a dense float vector (``u`` dense, or a row of a unit-rows matrix)."""
    s = V @ (u.T if sp.issparse(u) else u)
    return np.asarray(s.toarray() if sp.issparse(s) else s).ravel()
