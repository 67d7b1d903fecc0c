"""Stable id maps: external id (string) <-> dense index, extended but never renumbered, so that
factors and dual variables keep their meaning across retrains."""

from __future__ import annotations

import numpy as np


class IdMap:
    """Append-only map from external ids to ``0..n-1``.

    Examples
    --------
    >>> m = IdMap(["a", "b"])
    >>> m, idx = m.extend(np.array(["c", "a", "c"]))
    >>> idx.tolist(), m.ids.tolist()
    ([2, 0, 2], ['a', 'b', 'c'])
    """

    __slots__ = ("ids", "_order", "_sorted")

    def __init__(self, ids=()):
        self.ids = np.asarray(ids, dtype=str)
        if self.ids.ndim != 1:
            raise ValueError(f"ids must be one-dimensional, got shape {self.ids.shape}")
        self._order = np.argsort(self.ids, kind="stable")
        self._sorted = self.ids[self._order]
        if len(self._sorted) > 1 and (self._sorted[1:] == self._sorted[:-1]).any():
            dup = self._sorted[1:][self._sorted[1:] == self._sorted[:-1]][0]
            raise ValueError(f"ids must be unique, {str(dup)!r} appears more than once")

    def __len__(self) -> int:
        return len(self.ids)

    def lookup(self, ids) -> np.ndarray:
        """Indices of ``ids`` (int64), -1 where an id is unknown. Vectorized."""
        ids = np.asarray(ids, dtype=str)
        if len(self._sorted) == 0:
            return np.full(ids.shape, -1, dtype=np.int64)
        pos = np.searchsorted(self._sorted, ids)
        pos_c = np.minimum(pos, len(self._sorted) - 1)
        found = self._sorted[pos_c] == ids
        return np.where(found, self._order[pos_c], -1).astype(np.int64)

    def extend(self, ids) -> tuple["IdMap", np.ndarray]:
        """A map that also holds the unseen ``ids`` (appended in order of first appearance),
        and the indices of ``ids`` in it."""
        ids = np.asarray(ids, dtype=str)
        idx = self.lookup(ids)
        missing = idx < 0
        if missing.any():
            new, first = np.unique(ids[missing], return_index=True)
            new = new[np.argsort(first, kind="stable")]
            grown = IdMap(np.concatenate([self.ids, new]))
            return grown, grown.lookup(ids)
        return self, idx
