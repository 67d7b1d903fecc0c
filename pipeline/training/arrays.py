"""Event tables (Arrow, as the store returns them) to the arrays the solvers take: numeric
columns, id codes and sparse feature matrices; and sparse matrices to and from the plain arrays
of a bundle (:func:`csr_to_arrays`, :func:`csr_from_arrays`)."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc


def to_numpy(table: pa.Table) -> dict[str, np.ndarray]:
    """Columns of an event table as numpy arrays: numbers as int64/int32/float64, ids and text
    as object arrays, features as ``feature_indptr``, ``feature_index``, ``feature_value`` (CSR
    parts, see :func:`features_csr`)."""
    out = {}
    for name in table.column_names:
        column = table.column(name)
        if pa.types.is_list(column.type):
            continue
        out[name] = column.to_numpy()
    if "feature_index" in table.column_names:
        indptr, indices, values = _csr_parts(table)
        out.update(feature_indptr=indptr, feature_index=indices, feature_value=values)
    return out


def _csr_parts(table: pa.Table) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    index = table.column("feature_index").combine_chunks()
    value = table.column("feature_value").combine_chunks()
    offsets = index.offsets.to_numpy().astype(np.int64)
    start, stop = offsets[0], offsets[-1]
    return (offsets - start, index.values.to_numpy()[start:stop],
            value.values.to_numpy()[start:stop])


def features_csr(table: pa.Table, n_features: int | None = None,
                 max_features: int | None = None):
    """The features of an event table as a ``scipy.sparse.csr_matrix`` (rows = events).

    ``n_features``: the width (an error if an event has a higher index); ``max_features``:
    indices of that or more are left out.

    >>> import pyarrow as pa
    >>> t = pa.table({"feature_index": [[0, 2], []], "feature_value": [[1.0, 3.0], []]})
    >>> features_csr(t).toarray()
    array([[1., 0., 3.],
           [0., 0., 0.]])
    >>> features_csr(t, max_features=2).toarray()
    array([[1.],
           [0.]])
    """
    from scipy.sparse import csr_matrix

    indptr, indices, values = _csr_parts(table)
    if max_features is not None and indices.size and indices.max() >= max_features:
        keep = indices < max_features
        row = np.repeat(np.arange(len(indptr) - 1), np.diff(indptr))[keep]
        indices, values = indices[keep], values[keep]
        indptr = np.r_[0, np.cumsum(np.bincount(row, minlength=len(indptr) - 1))]
    width = int(indices.max()) + 1 if indices.size else 0
    if n_features is not None:
        if width > n_features:
            raise ValueError(f"events have feature index {width - 1}, "
                             f"but n_features is {n_features}")
        width = n_features
    return csr_matrix((values, indices, indptr), shape=(table.num_rows, width))


def id_codes(column: pa.ChunkedArray | pa.Array) -> tuple[np.ndarray, np.ndarray]:
    """``(codes, ids)`` with ``ids[codes] == column``: ids in order of first appearance.

    >>> import pyarrow as pa
    >>> id_codes(pa.array(["b", "a", "b"]))
    (array([0, 1, 0], dtype=int32), array(['b', 'a'], dtype=object))
    """
    encoded = pc.dictionary_encode(column)
    if isinstance(encoded, pa.ChunkedArray):
        encoded = encoded.unify_dictionaries().combine_chunks() if encoded.num_chunks else \
            pa.array([], pa.dictionary(pa.int32(), pa.string()))
    return (encoded.indices.to_numpy(zero_copy_only=False),
            encoded.dictionary.to_numpy(zero_copy_only=False))


def csr_to_arrays(X, prefix: str = "X") -> dict[str, np.ndarray]:
    """A sparse matrix as the plain arrays of a bundle: ``{prefix}_data``, ``{prefix}_indices``,
    ``{prefix}_indptr`` and ``{prefix}_shape`` (``np.savez``-able, no pickle).

    >>> from scipy.sparse import csr_matrix
    >>> arrays = csr_to_arrays(csr_matrix(np.array([[0.0, 2.0], [1.0, 0.0]])))
    >>> sorted(arrays), arrays["X_shape"].tolist()
    (['X_data', 'X_indices', 'X_indptr', 'X_shape'], [2, 2])
    >>> csr_from_arrays(arrays).toarray()
    array([[0., 2.],
           [1., 0.]])
    """
    X = X.tocsr()
    return {f"{prefix}_data": X.data, f"{prefix}_indices": X.indices,
            f"{prefix}_indptr": X.indptr, f"{prefix}_shape": np.array(X.shape)}


def csr_from_arrays(arrays: dict, prefix: str = "X"):
    """The ``scipy.sparse.csr_matrix`` that :func:`csr_to_arrays` flattened into ``arrays``."""
    from scipy.sparse import csr_matrix

    return csr_matrix((arrays[f"{prefix}_data"], arrays[f"{prefix}_indices"],
                       arrays[f"{prefix}_indptr"]), shape=tuple(arrays[f"{prefix}_shape"]))
