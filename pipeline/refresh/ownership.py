"""Which users' histories a refresher holds when several share a model's topics.

Events keyed by user (what ``rankstream produce``, the HTTP and file paths and ``rankstream
rekey`` send) go to the partition Kafka's default partitioner gives the user's key: murmur2 of
its UTF-8 bytes, the sign bit cleared, modulo the topic's partitions (the Java client's rule,
``kafka.partitioner.default``). Every event of a user then reaches the refresher assigned that
partition, so a refresher needs the stored history of those users only: with N refreshers each
holds about 1/N of the users, not the whole store. A partition that brings an event of a user
hashed elsewhere says its topic is not keyed by user; the refresher then holds every user
(:meth:`pipeline.refresh.refresher.Refresher.hold`).

Examples
--------
>>> partitions_of(["7", "alice"], 4).tolist()     # kafka-python's murmur2 gives the same
[3, 1]
>>> mine = Ownership({"events": {3}}, {"events": 4})
>>> mine.owns(["7", "alice"]).tolist()
[True, False]
"""

from __future__ import annotations

import numpy as np
from numba import njit

_MASK = np.uint64(0xFFFFFFFF)
_M = np.uint64(0x5BD1E995)


@njit(cache=True)
def _murmur2_partitions(data, starts, n, out):
    """``out[j]``: the partition of the j-th key (``data[starts[j]:starts[j + 1]]``) among ``n``:
    Kafka's murmur2 (seed 0x9747b28c), its sign bit cleared, modulo ``n``."""
    for j in range(starts.shape[0] - 1):
        lo, length = starts[j], starts[j + 1] - starts[j]
        h = (np.uint64(0x9747B28C) ^ np.uint64(length)) & _MASK
        for i in range(length // 4):
            p = lo + 4 * i
            k = (np.uint64(data[p]) | (np.uint64(data[p + 1]) << np.uint64(8))
                 | (np.uint64(data[p + 2]) << np.uint64(16))
                 | (np.uint64(data[p + 3]) << np.uint64(24)))
            k = (k * _M) & _MASK
            k ^= k >> np.uint64(24)
            k = (k * _M) & _MASK
            h = ((h * _M) & _MASK) ^ k
        tail, extra = lo + length - length % 4, length % 4
        if extra >= 3:
            h ^= np.uint64(data[tail + 2]) << np.uint64(16)
        if extra >= 2:
            h ^= np.uint64(data[tail + 1]) << np.uint64(8)
        if extra >= 1:
            h = ((h ^ np.uint64(data[tail])) * _M) & _MASK
        h ^= h >> np.uint64(13)
        h = (h * _M) & _MASK
        h ^= h >> np.uint64(15)
        out[j] = np.int64(h & np.uint64(0x7FFFFFFF)) % n


def partitions_of(keys, n: int) -> np.ndarray:
    """The partition among ``n`` that Kafka's default partitioner gives each user key (the
    key's text, :func:`pipeline.serving.layout.key_of`)."""
    encoded = [str(k).encode("utf-8", "replace") for k in keys]
    starts = np.zeros(len(encoded) + 1, np.int64)
    np.cumsum([len(e) for e in encoded], out=starts[1:])
    data = np.frombuffer(b"".join(encoded), np.uint8)
    out = np.empty(len(encoded), np.int64)
    _murmur2_partitions(data, starts, int(n), out)
    return out


class Ownership:
    """The users whose key hashes to a partition this refresher is ``assigned`` (topic -> its
    partitions) in a topic of ``counts`` (topic -> how many partitions it has)."""

    def __init__(self, assigned: dict, counts: dict):
        self.assigned = {t: frozenset(int(p) for p in ps) for t, ps in assigned.items() if ps}
        self.counts = {t: int(counts[t]) for t in self.assigned}

    @classmethod
    def of(cls, assigned: dict, counts: dict) -> Ownership | None:
        """The ownership of an assignment; None (every user) where it holds every partition
        of some topic, as one refresher of a model does."""
        if any(len(set(assigned.get(t, ()))) >= n for t, n in counts.items() if n):
            return None
        return cls(assigned, counts)

    def within(self, other: Ownership | None) -> bool:
        """Whether every user held here is held by ``other`` too (None: everyone)."""
        return other is None or (self.counts == {t: other.counts.get(t) for t in self.counts}
                                 and all(ps <= other.assigned.get(t, frozenset())
                                         for t, ps in self.assigned.items()))

    def owns(self, keys) -> np.ndarray:
        """Whether each user key hashes to a partition held here, in some topic."""
        keys = list(keys)
        mine = np.zeros(len(keys), bool)
        for topic, held in self.assigned.items():
            mine |= np.isin(partitions_of(keys, self.counts[topic]), list(held))
        return mine

    def strays(self, keys, topic: str, partition: int) -> list:
        """The keys of ``keys`` (users of events read from ``topic``'s ``partition``) that hash
        to another partition: events not keyed by user."""
        keys = list(keys)
        if topic not in self.counts or not keys:
            return []
        return [k for k, p in zip(keys, partitions_of(keys, self.counts[topic]))
                if p != partition]

    def describe(self) -> str:
        return "; ".join(f"{t} {sorted(ps)} of {self.counts[t]}"
                         for t, ps in sorted(self.assigned.items()))
