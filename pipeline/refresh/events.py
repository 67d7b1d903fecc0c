"""What a user's events come to for a fold-in, by training's rules: the reference, over a plain
list of events (:class:`~pipeline.refresh.history.UserHistory` keeps the same incrementally).

A user's history is every rating, interaction and comparison event of the model's kinds. An
event met twice (the store's copy and the stream's) counts once, so a replay is harmless:

- the model's window (``last_days``/``last_events``) first, by training's own
  :func:`~pipeline.training.datasets.window_start` over every event held;
- ratings and interactions: the latest event per (user, item) wins (by time, then offset), as
  training's dataset takes it; ratings outside the model's ``rating_range`` are left out first;
- comparisons: one per ``event_id``, its latest copy (by time, then offset), as training's.

:func:`inputs_from` then turns them into the served version's terms, as training counts them:
``seen`` (every met item: never served back to the user), ``winners`` (items rated at least
``min_rating``, and interactions: the met items training's implicit comparisons start from) and
``pairs`` (comparison events, plus within-user rating pairs when the model's comparisons are
``explicit`` or ``mixed``, past ``max_pairs_per_user`` the ones training keeps, by training's
code), each as the version's item indices (items it does not know are skipped: they cannot be
scored), in an order fixed by those indices (the same inputs, the same fold-in bits).

``tests/refresh/test_conformance.py`` feeds random histories to training and to the refresher
and requires the same per-user inputs.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import pyarrow as pa

from pipeline.serving.layout import key_of
from pipeline.training.trainers.altsvm_comparisons import user_salts
from pipeline.training.trainers.altsvm_data import COLUMNS  # what training reads, the same
from solvers.fold_in import sorted_unique
from solvers.pairs import pairs_from_ratings

USER_KINDS = ("rating", "interaction", "comparison")


@dataclass(frozen=True, slots=True)
class Event:
    """One event of a user: ``kind``; ``item`` (a comparison's winner), ``other`` (its loser),
    ``rating`` (NaN for an interaction or a comparison), ``ts``, ``offset``, ``event_id``;
    ``source``: the Kafka (topic, partition) a streamed event came from (None: the store's)."""

    kind: str
    item: object
    other: object
    rating: float
    ts: int
    offset: int
    event_id: str = ""
    source: object = None


def events_of(kind: str, table: pa.Table, source=None) -> list[tuple[str, Event]]:
    """``(user key, Event)`` of every row of an Arrow table of one kind."""
    if kind not in USER_KINDS or not table.num_rows:
        return []
    col = table.column
    users = [key_of(u) for u in col("user").to_pylist()]
    ts, off = col("ts").to_pylist(), col("offset").to_pylist()
    if kind == "comparison":
        ids = col("event_id").to_pylist()
        return [(u, Event(kind, w, lo, math.nan, t, o, str(e), source))
                for u, w, lo, t, o, e in zip(users, col("winner").to_pylist(),
                                             col("loser").to_pylist(), ts, off, ids)]
    ratings = (col("rating").to_pylist() if kind == "rating" else [None] * len(users))
    return [(u, Event(kind, i, None, math.nan if r is None else float(r), t, o, "", source))
            for u, i, r, t, o in zip(users, col("item").to_pylist(), ratings, ts, off)]


def stored_events(store, kinds) -> dict[str, list[Event]]:
    """Every user's events of ``kinds`` in the event store, in the store's order."""
    out: dict[str, list[Event]] = {}
    for kind in kinds:
        if kind in USER_KINDS:
            for user, event in events_of(kind, store.read(kind, columns=COLUMNS[kind])):
                out.setdefault(user, []).append(event)
    return out


@dataclass(frozen=True)
class FoldInInputs:
    seen: np.ndarray      # every met item (int64 indices)
    winners: np.ndarray   # met items that win implicit comparisons
    pairs: np.ndarray     # (n, 2) winner, loser indices


def bounds_of(spec: dict) -> tuple[float, float]:
    low, high = spec.get("rating_range") or (-math.inf, math.inf)
    return float(low), float(high)


def inputs_from(idx: np.ndarray, ratings: np.ndarray, compared: np.ndarray, spec: dict,
                user: str = "") -> FoldInInputs:
    """:class:`FoldInInputs` of a user's latest in-window met items (``idx``: the version's
    indices, -1 where it does not know one; ``ratings``: NaN for an interaction) and
    comparisons (``compared``: (n, 2) winner, loser indices, -1 likewise), by the version's
    fold-in ``spec`` (``min_rating``, ``comparisons``, ``max_pairs_per_user``, ``seed``) for
    ``user`` (their key)."""
    min_rating = float(spec.get("min_rating", -math.inf))
    known = idx >= 0
    idx, r = idx[known], np.asarray(ratings, np.float64)[known]
    order = np.argsort(idx, kind="stable")
    idx, r = idx[order], r[order]
    winners = sorted_unique(idx[np.isnan(r) | (r >= min_rating)])
    pairs = compared
    if len(pairs):
        pairs = pairs[(pairs >= 0).all(axis=1) & (pairs[:, 0] != pairs[:, 1])]
        pairs = pairs[np.lexsort((pairs[:, 1], pairs[:, 0]))]
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
    (the window's first time) in a version's item indices (``index_of(item)``: the index, or
    None), by the version's fold-in ``spec`` (``min_rating``, ``rating_range``,
    ``comparisons``, ...) for ``user`` (their key), the rules of the module taken in their
    order: the reference :meth:`UserHistory.inputs` keeps incrementally."""
    low, high = bounds_of(spec)
    latest: dict = {}       # item -> ((ts, offset), rating)
    compared: dict = {}     # event id -> ((ts, offset), winner, loser)
    for e in events:
        if start is not None and e.ts < start:
            continue
        key = (e.ts, e.offset)
        if e.kind == "comparison":
            if e.event_id not in compared or key >= compared[e.event_id][0]:
                compared[e.event_id] = (key, e.item, e.other)
        elif math.isnan(e.rating) or low <= e.rating <= high:
            if e.item not in latest or key >= latest[e.item][0]:
                latest[e.item] = (key, e.rating)

    def index(item) -> int:
        found = index_of(item)
        return -1 if found is None else int(found)

    idx = np.array([index(item) for item in latest], np.int64)
    ratings = np.array([rating for _, rating in latest.values()], np.float64)
    pairs = np.array([(index(w), index(lo)) for _, w, lo in compared.values()],
                     np.int64).reshape(-1, 2)
    return inputs_from(idx, ratings, pairs, spec, user)
