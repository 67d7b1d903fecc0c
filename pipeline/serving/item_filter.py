"""Item filters of a lookup (``exclude`` and ``allow``), resolved against one published version.

An answer with a filter holds exactly ``k`` items whenever ``k`` eligible items exist: an item
is eligible when it is in the version, not excluded, in ``allow`` (when given) and not one the
user already met. The lookup client filters the user's precomputed list first and, when that
runs short, ranks every eligible item: from the user's factor, or for the fallback by the
global list's per-item scores (``global_scores`` in ``REDIS_LAYOUT.md``).

Ids the version does not know are skipped: excluding one changes nothing, allowing one adds
nothing. Each list holds at most ``MAX_FILTER`` ids.

Examples
--------
>>> class Version:  # the two things a filter reads of a version
...     item_ids = [10, 11, 12]
...     def index_of(self, item):
...         return {10: 0, 11: 1, 12: 2}.get(int(item))
>>> f = ItemFilter(Version(), exclude=["11", 99])
>>> f.keep([(10, 3.0), (11, 2.0), (12, 1.0)])
[(10, 3.0), (12, 1.0)]
>>> f.mask(np.array([3.0, 2.0, 1.0])).tolist()
[3.0, -inf, 1.0]
"""

from __future__ import annotations

import numpy as np

MAX_FILTER = 1000
_NONE = np.zeros(0, np.intp)
_NONE.flags.writeable = False


def _indices(st, name: str, items) -> np.ndarray:
    items = list(items)
    if len(items) > MAX_FILTER:
        raise ValueError(f"{name} lists {len(items)} items, at most {MAX_FILTER} are taken")
    found = {st.index_of(x) for x in items} - {None}
    return np.fromiter(sorted(found), np.intp, len(found))


class ItemFilter:
    """``exclude`` and ``allow`` (iterables of item ids, or None) of one version;
    ``also_excluded``: item indices left out as well (a folded-in user's own items)."""

    __slots__ = ("excluded", "allowed", "excluded_ids", "allowed_ids")

    def __init__(self, st, exclude=None, allow=None, also_excluded=()):
        if not exclude and allow is None and not len(also_excluded):   # a plain lookup's
            self.excluded, self.allowed, self.excluded_ids, self.allowed_ids = \
                _NONE, None, frozenset(), None
            return
        self.excluded = np.union1d(_indices(st, "exclude", exclude or ()),
                                   np.asarray(also_excluded, np.intp)).astype(np.intp)
        self.allowed = None if allow is None else _indices(st, "allow", allow)
        ids = st.item_ids
        self.excluded_ids = {ids[i] for i in self.excluded.tolist()}
        self.allowed_ids = None if allow is None else {ids[i] for i in self.allowed.tolist()}

    def keep(self, pairs: list) -> list:
        """The (item id, score) pairs the filter lets through, in their order."""
        out, allowed = pairs, self.allowed_ids
        if self.excluded_ids:
            out = [p for p in out if p[0] not in self.excluded_ids]
        if allowed is not None:
            out = [p for p in out if p[0] in allowed]
        return out

    def mask(self, scores: np.ndarray) -> np.ndarray:
        """A copy of per-item ``scores`` with -inf where the filter takes an item out."""
        if self.allowed is not None:
            out = np.full_like(scores, -np.inf)
            out[self.allowed] = scores[self.allowed]
        else:
            out = scores.copy()
        out[self.excluded] = -np.inf
        return out
