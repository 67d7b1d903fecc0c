"""Each user's whole history for the refresher, and what a fold-in takes from it.

A user's history is every rating, interaction and comparison event of the model's kinds: what
the event store holds (read once per served version: what the version learned from, and what
ingest stored since) joined with what the refresher consumed from Kafka since the version's
watermark (events ingest may not have stored yet). An event in both is the same event, and the
rules below make a second copy count once, so a replay is harmless:

- ratings and interactions: the latest event per (user, item) wins (by time, then offset), as
  training's dataset takes it; ratings outside the model's ``rating_range`` are left out first;
- comparisons: one per ``event_id``.

:func:`fold_in_inputs` then turns them into the served version's terms, as training counts
them: ``seen`` (every met item: never served back to the user), ``winners`` (items rated at least
``min_rating``, and interactions: the met items training's implicit comparisons start from) and
``pairs`` (comparison events, plus within-user rating pairs when the model's comparisons are
``explicit`` or ``mixed``), each as the version's item indices (items it does not know are
skipped: they cannot be scored).
"""

from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import dataclass

import numpy as np
import pyarrow as pa

from pipeline.serving.layout import key_of

USER_KINDS = ("rating", "interaction", "comparison")
COLUMNS = {"rating": ["ts", "offset", "user", "item", "rating"],
           "interaction": ["ts", "offset", "user", "item"],
           "comparison": ["ts", "offset", "event_id", "user", "winner", "loser"]}


@dataclass(frozen=True)
class Event:
    """One event of a user: ``kind``; ``item`` (a comparison's winner), ``other`` (its loser),
    ``rating`` (NaN for an interaction or a comparison), ``ts``, ``offset``, ``event_id``."""

    kind: str
    item: object
    other: object
    rating: float
    ts: int
    offset: int
    event_id: str = ""


def events_of(kind: str, table: pa.Table) -> list[tuple[str, Event]]:
    """``(user key, Event)`` of every row of an Arrow table of one kind."""
    if kind not in USER_KINDS or not table.num_rows:
        return []
    col = table.column
    users = [key_of(u) for u in col("user").to_pylist()]
    ts, off = col("ts").to_pylist(), col("offset").to_pylist()
    if kind == "comparison":
        ids = col("event_id").to_pylist()
        return [(u, Event(kind, w, lo, math.nan, t, o, str(e))) for u, w, lo, t, o, e in
                zip(users, col("winner").to_pylist(), col("loser").to_pylist(), ts, off, ids)]
    ratings = (col("rating").to_pylist() if kind == "rating" else [math.nan] * len(users))
    return [(u, Event(kind, i, None, math.nan if r is None else float(r), t, o))
            for u, i, r, t, o in zip(users, col("item").to_pylist(), ratings, ts, off)]


class UserHistory:
    """Every user's events (see the module): the store's, replaced whole by :meth:`load_store`,
    and the stream's, added by :meth:`add` since the served version's watermark."""

    def __init__(self):
        self.stored: dict[str, list[Event]] = defaultdict(list)
        self.streamed: dict[str, list[tuple]] = defaultdict(list)   # (source, Event)

    def load_store(self, store, kinds) -> int:
        """Read the model's kinds from the event store (all of it); the number of events."""
        self.stored = defaultdict(list)
        n = 0
        for kind in kinds:
            if kind not in USER_KINDS:
                continue
            for user, event in events_of(kind, store.read(kind, columns=COLUMNS[kind])):
                self.stored[user].append(event)
                n += 1
        return n

    def add(self, kind: str, table: pa.Table, source=None) -> set[str]:
        """Add streamed events (``source``: the Kafka (topic, partition) they came from, or
        None); the users they touched."""
        touched = set()
        for user, event in events_of(kind, table):
            self.streamed[user].append((source, event))
            touched.add(user)
        return touched

    def forget_stored(self, stored_until) -> None:
        """Drop streamed events the store holds now (``stored_until(source)``: the store's
        next offset of that Kafka topic partition, or None); they were read again by
        :meth:`load_store`."""
        for user in list(self.streamed):
            kept = [(src, e) for src, e in self.streamed[user]
                    if src is None or e.offset >= (stored_until(src) or 0)]
            if kept:
                self.streamed[user] = kept
            else:
                del self.streamed[user]

    def users(self) -> set[str]:
        return set(self.stored) | set(self.streamed)

    def of(self, user: str) -> list[Event]:
        return self.stored.get(user, []) + [e for _, e in self.streamed.get(user, [])]


@dataclass(frozen=True)
class FoldInInputs:
    seen: np.ndarray      # every met item (int64 indices)
    winners: np.ndarray   # met items that win implicit comparisons
    pairs: np.ndarray     # (n, 2) winner, loser indices


def _latest_ratings(events: list[Event], low: float, high: float) -> dict:
    """item -> rating (NaN: an interaction) of the latest rating or interaction per item."""
    latest: dict = {}
    for e in events:
        if e.kind == "comparison" or (not math.isnan(e.rating) and not low <= e.rating <= high):
            continue
        key = (e.ts, e.offset)
        if e.item not in latest or key >= latest[e.item][0]:
            latest[e.item] = (key, e.rating)
    return {item: rating for item, (_, rating) in latest.items()}


def fold_in_inputs(events: list[Event], index_of, spec: dict) -> FoldInInputs:
    """A user's :class:`FoldInInputs` in a version's item indices (``index_of(item)``: the
    index, or None), by the version's fold-in ``spec`` (``min_rating``, ``rating_range``,
    ``comparisons``)."""
    low, high = spec.get("rating_range") or (-math.inf, math.inf)
    min_rating = float(spec.get("min_rating", -math.inf))
    rated = _latest_ratings(events, float(low), float(high))
    known = {item: (index_of(item), r) for item, r in rated.items()}
    known = {item: (i, r) for item, (i, r) in known.items() if i is not None}
    seen = np.array(sorted({i for i, _ in known.values()}), np.int64)
    winners = np.array(sorted({i for i, r in known.values()
                               if math.isnan(r) or r >= min_rating}), np.int64)
    pairs, ids = [], set()
    for e in events:
        if e.kind == "comparison" and e.event_id not in ids:
            ids.add(e.event_id)
            w, lo = index_of(e.item), index_of(e.other)
            if w is not None and lo is not None and w != lo:
                pairs.append((w, lo))
    if spec.get("comparisons") in ("explicit", "mixed"):
        scored = [(i, r) for i, r in known.values() if not math.isnan(r)]
        pairs += [(a, b) for a, ra in scored for b, rb in scored if ra > rb]
    return FoldInInputs(seen, winners, np.array(pairs, np.int64).reshape(-1, 2))
