"""Each user's whole history for the refresher, and what a fold-in takes from it.

A user's history is every rating, interaction and comparison event of the model's kinds: what
the event store holds (read once per served version: what the version learned from, and what
ingest stored since) joined with what the refresher consumed from Kafka since the version's
watermark (events ingest may not have stored yet). An event in both is the same event, and the
rules below make a second copy count once, so a replay is harmless:

- ratings and interactions: the latest event per (user, item) wins (by time, then offset), as
  training's dataset takes it; ratings outside the model's ``rating_range`` are left out first;
- comparisons: one per ``event_id``, its latest copy (by time, then offset), as training's;
- the model's window (``last_days``/``last_events``) first, by training's own
  :func:`~pipeline.training.datasets.window_start` over every event the refresher holds.

``tests/refresh/test_conformance.py`` feeds random histories to both and requires the same
per-user inputs.

:func:`fold_in_inputs` then turns them into the served version's terms, as training counts
them: ``seen`` (every met item: never served back to the user), ``winners`` (items rated at least
``min_rating``, and interactions: the met items training's implicit comparisons start from) and
``pairs`` (comparison events, plus within-user rating pairs when the model's comparisons are
``explicit`` or ``mixed``, past ``max_pairs_per_user`` the ones training keeps, by training's
code), each as the version's item indices (items it does not know are skipped: they cannot be
scored).
"""

from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import dataclass

import numpy as np
import pyarrow as pa

from pipeline.serving.layout import key_of
from pipeline.training.datasets import window_start
from pipeline.training.trainers.altsvm_comparisons import user_salts
from pipeline.training.trainers.altsvm_data import COLUMNS  # what training reads, the same
from solvers.fold_in import sorted_unique
from solvers.pairs import pairs_from_ratings

USER_KINDS = ("rating", "interaction", "comparison")


@dataclass(frozen=True, slots=True)
class Event:
    """One event of a user: ``kind``; ``item`` (a comparison's winner), ``other`` (its loser),
    ``rating`` (NaN for an interaction or a comparison), ``ts``, ``offset``, ``event_id``;
    ``source``: the Kafka (topic, partition) a streamed event came from (None: the store's).
    Slots, no per-event dict: the refresher holds every event of its users (about 100 bytes
    each with ``ts`` and ``offset``, against 460 as a plain dataclass in a (source, event)
    pair)."""

    kind: str
    item: object
    other: object
    rating: float
    ts: int
    offset: int
    event_id: str = ""
    source: object = None


def events_of(kind: str, table: pa.Table, source=None, shared: dict | None = None
              ) -> list[tuple[str, Event]]:
    """``(user key, Event)`` of every row of an Arrow table of one kind; ``shared``: a dict
    that interns the ids and ratings, so that a user's or an item's id is one object however
    many events name it (Arrow gives each row its own)."""
    if kind not in USER_KINDS or not table.num_rows:
        return []
    one = (lambda x: x) if shared is None else (lambda x: shared.setdefault((type(x), x), x))
    col = table.column
    users = [one(key_of(u)) for u in col("user").to_pylist()]
    ts, off = col("ts").to_pylist(), col("offset").to_pylist()
    if kind == "comparison":
        ids = col("event_id").to_pylist()
        return [(u, Event(kind, one(w), one(lo), math.nan, t, o, str(e), source))
                for u, w, lo, t, o, e in zip(users, col("winner").to_pylist(),
                                             col("loser").to_pylist(), ts, off, ids)]
    ratings = (col("rating").to_pylist() if kind == "rating" else [None] * len(users))
    return [(u, Event(kind, one(i), None, math.nan if r is None else one(float(r)), t, o,
                      "", source))
            for u, i, r, t, o in zip(users, col("item").to_pylist(), ratings, ts, off)]


class UserHistory:
    """Every user's events (see the module): the store's, replaced whole by :meth:`load_store`,
    and the stream's, added by :meth:`add` since the served version's watermark."""

    def __init__(self):
        self.stored: dict[str, list[Event]] = defaultdict(list)
        self.streamed: dict[str, list[Event]] = defaultdict(list)
        self.shared: dict = {}                   # the ids and ratings held, interned
        self.digests: dict[str, Digest] = {}     # user -> digest of their first events
        self.stored_ts = np.zeros(0, np.int64)   # every stored event's time, for the window
        self.newest: int | None = None           # the newest time held
        self.last_start: tuple | None = None     # (last_events' start, events arrived since)

    def load_store(self, store, kinds) -> int:
        """Read the model's kinds from the event store (all of it); the number of events."""
        self.stored = defaultdict(list)
        self.digests = {}
        self.shared = {k: v for e in (e for es in self.streamed.values() for e in es)
                       for k, v in _held(e)}     # what is streamed keeps its ids
        for kind in kinds:
            if kind not in USER_KINDS:
                continue
            for user, event in events_of(kind, store.read(kind, columns=COLUMNS[kind]),
                                         shared=self.shared):
                self.stored[user].append(event)
        self.stored_ts = np.array([e.ts for events in self.stored.values() for e in events],
                                  np.int64)
        times = self._streamed_ts()
        times = [int(a.max()) for a in (self.stored_ts, times) if a.size]
        self.newest, self.last_start = (max(times) if times else None), None
        return len(self.stored_ts)

    def window_start(self, window: dict) -> int | None:
        """The model's window over every event held (:func:`window_start`, training's rule):
        the first time a user's inputs keep, or None. ``last_days`` counts back from the
        newest time held; ``last_events`` is found again over every time held once 1% of the
        window has arrived since (its start moves by at most the arrivals: a pass over the
        times per 1% of the window, not per batch, for a window at most 1% too long)."""
        if not window:
            return None
        if "last_days" in window:
            return None if self.newest is None else window_start(
                np.array([self.newest], np.int64), window)
        if self.last_start is None or self.last_start[1] >= max(1, window["last_events"] // 100):
            start = window_start(np.concatenate([self.stored_ts, self._streamed_ts()]), window)
            self.last_start = (start, 0)
        return self.last_start[0]

    def _streamed_ts(self) -> np.ndarray:
        return np.array([e.ts for events in self.streamed.values() for e in events],
                        np.int64)

    def add(self, kind: str, table: pa.Table, source=None) -> set[str]:
        """Add streamed events (``source``: the Kafka (topic, partition) they came from, or
        None); the users they touched."""
        touched = set()
        events = events_of(kind, table, source, self.shared)
        for user, event in events:
            self.streamed[user].append(event)
            touched.add(user)
        if events:
            newest = max(e.ts for _, e in events)
            self.newest = newest if self.newest is None else max(self.newest, newest)
            if self.last_start is not None:
                self.last_start = (self.last_start[0], self.last_start[1] + len(events))
        return touched

    def forget_stored(self, stored_until) -> None:
        """Drop streamed events the store holds now (``stored_until(source)``: the store's
        next offset of that Kafka topic partition, or None); they were read again by
        :meth:`load_store`."""
        self.digests = {}       # a user's events are in another order now: digest anew
        for user in list(self.streamed):
            kept = [e for e in self.streamed[user]
                    if e.source is None or e.offset >= (stored_until(e.source) or 0)]
            if kept:
                self.streamed[user] = kept
            else:
                del self.streamed[user]

    def users(self) -> set[str]:
        return set(self.stored) | set(self.streamed)

    def of(self, user: str) -> list[Event]:
        return self.stored.get(user, []) + self.streamed.get(user, [])

    def inputs(self, user: str, index_of, spec: dict, token=None,
               start: int | None = None) -> FoldInInputs:
        """:func:`fold_in_inputs` of the user's whole history from ``start`` on (the window's
        first time, :meth:`window_start`), from their digest with only the events since added
        (events are only appended between :meth:`load_store` and :meth:`forget_stored`, which
        start every digest anew; a window that moved past an event digested does too);
        ``token`` names the version whose ``index_of`` it is, to look each item up once."""
        bounds = bounds_of(spec)
        digest = self.digests.get(user)
        if digest is None or digest.bounds != bounds or not digest.moved_to(start):
            digest = self.digests[user] = Digest(bounds, start)
        stored = self.stored.get(user, [])
        streamed = self.streamed.get(user, [])
        done = digest.consumed
        if done < len(stored):
            digest.add(stored[done:])
            done = len(stored)
        digest.add(streamed[done - len(stored):])
        return inputs_of(digest, index_of, spec, token, user)


def _held(event: Event):
    """The interned values of ``event`` (see :func:`events_of`), as ``shared``'s items."""
    for x in (event.item, event.other, event.rating):
        if x is not None and not (type(x) is float and math.isnan(x)):
            yield (type(x), x), x


@dataclass(frozen=True)
class FoldInInputs:
    seen: np.ndarray      # every met item (int64 indices)
    winners: np.ndarray   # met items that win implicit comparisons
    pairs: np.ndarray     # (n, 2) winner, loser indices


class Digest:
    """What a run of a user's events comes to, by the rules of the module: for each item, the
    latest in-scale rating or interaction (``items[n]``, ``ratings[n]``, NaN for an
    interaction, at ``(ts, offset)`` ``keys[n]``), and each comparison event id's latest
    ``((ts, offset), (winner, loser))`` in ``compared``.

    Both are order-free folds (maxima by (ts, offset)), so events can be added as
    they come: the digest of a history and its extension is the digest of the whole. The
    refresher keeps one per user and adds only the events since, instead of re-reading the
    whole history every batch; it also keeps the items' indices in the served version
    (``token`` names the version), looked up once per item."""

    __slots__ = ("bounds", "start", "oldest", "consumed", "slot", "items", "ratings", "keys",
                 "compared", "token", "indices", "pair_indices")

    def __init__(self, bounds: tuple[float, float], start: int | None = None):
        self.bounds = bounds
        self.start = start         # events before this time are outside the window (None: none)
        self.oldest = math.inf     # the oldest time taken in
        self.consumed = 0          # how many of the user's events are in
        self.slot: dict = {}       # item -> n
        self.items: list = []
        self.ratings: list = []
        self.keys: list = []
        self.compared: dict = {}
        self.token = None
        self.indices: list = []        # the version's index of items[n] (-1: unknown)
        self.pair_indices: list = []   # of compared's values, in order

    def add(self, events) -> "Digest":
        low, high = self.bounds
        slot, compared = self.slot, self.compared
        for e in events:
            if self.start is not None and e.ts < self.start:
                continue
            self.oldest = min(self.oldest, e.ts)
            if e.kind == "comparison":
                key, last = (e.ts, e.offset), compared.get(e.event_id)
                if last is None or key >= last[0]:
                    if last is not None and last[1] != (e.item, e.other):
                        self.pair_indices = []     # an edited copy: index the pairs anew
                    compared[e.event_id] = (key, (e.item, e.other))
                continue
            if not math.isnan(e.rating) and not low <= e.rating <= high:
                continue
            key = (e.ts, e.offset)
            n = slot.get(e.item)
            if n is None:
                slot[e.item] = len(self.items)
                self.items.append(e.item)
                self.ratings.append(e.rating)
                self.keys.append(key)
            elif key >= self.keys[n]:
                self.ratings[n], self.keys[n] = e.rating, key
        self.consumed += len(events)
        return self

    def moved_to(self, start: int | None) -> bool:
        """Take the window's ``start`` if this digest stays the digest of the same events under
        it (nothing taken falls out, nothing left out comes back); False: digest anew."""
        if start == self.start:
            return True
        if start is None or (self.start is not None and start < self.start) \
                or self.oldest < start:
            return False
        self.start = start
        return True

    def indexed(self, index_of, token) -> tuple[np.ndarray, list]:
        """The items' indices (-1: unknown to the version) and the comparisons' index pairs,
        looking up only what is new since the last call with the same ``token``."""
        if token is None or token != self.token:
            self.token, self.indices, self.pair_indices = token, [], []
        for item in self.items[len(self.indices):]:
            i = index_of(item)
            self.indices.append(-1 if i is None else i)
        for _, (w, lo) in list(self.compared.values())[len(self.pair_indices):]:
            self.pair_indices.append((index_of(w), index_of(lo)))
        return np.array(self.indices, np.int64), self.pair_indices


def bounds_of(spec: dict) -> tuple[float, float]:
    low, high = spec.get("rating_range") or (-math.inf, math.inf)
    return float(low), float(high)


def inputs_of(digest: Digest, index_of, spec: dict, token=None, user: str = "") -> FoldInInputs:
    """A digest's :class:`FoldInInputs` in a version's item indices (``index_of(item)``: the
    index, or None; ``token``: a name of that version, to keep the lookups), by the version's
    fold-in ``spec`` (``min_rating``, ``comparisons``, ``max_pairs_per_user`` and ``seed``) for
    ``user`` (their key)."""
    min_rating = float(spec.get("min_rating", -math.inf))
    idx, pair_idx = digest.indexed(index_of, token)
    r = np.array(digest.ratings, np.float64)
    known = idx >= 0
    idx, r = idx[known], r[known]
    winners = sorted_unique(idx[np.isnan(r) | (r >= min_rating)])
    pairs = np.array([(w, lo) for w, lo in pair_idx
                      if w is not None and lo is not None and w != lo],
                     np.int64).reshape(-1, 2)
    if spec.get("comparisons") in ("explicit", "mixed"):
        # every rated pair a > b with r_a > r_b, past the spec's cap the ones training keeps
        # (training's own code, the same hash of the seed, the user's key and the two items)
        scored = ~np.isnan(r)
        rated = pairs_from_ratings(
            np.zeros(int(scored.sum()), np.int64), idx[scored], r[scored],
            max_pairs_per_user=spec.get("max_pairs_per_user") or None,
            random_state=int(spec.get("seed", 0)),
            user_salts=user_salts([user], [0]) if spec.get("max_pairs_per_user") else None)
        pairs = np.concatenate([pairs, rated[:, 1:]])
    return FoldInInputs(sorted_unique(idx), winners, pairs)


def fold_in_inputs(events: list[Event], index_of, spec: dict, user: str = "",
                   start: int | None = None) -> FoldInInputs:
    """A user's :class:`FoldInInputs` from their whole history ``events`` from ``start`` on
    (the window's first time) in a version's item indices, by the version's fold-in ``spec``
    (``min_rating``, ``rating_range``, ``comparisons``, ...) for ``user`` (their key): the
    reference :meth:`UserHistory.inputs` keeps incrementally."""
    return inputs_of(Digest(bounds_of(spec), start).add(events), index_of, spec, user=user)
