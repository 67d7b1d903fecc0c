"""The refresher and training count a user's events by one rule (issue 53): random histories
(repeated items and comparison ids, equal and out-of-order times, ratings off the scale,
interactions after ratings) go through training's dataset builder
(:func:`~pipeline.training.trainers.altsvm_data.collaborative`) and through the refresher's
:func:`~pipeline.refresh.history.fold_in_inputs`; every user's met items, winning items and
comparison pairs must be the same.

Training reads an event store: here a stand-in that serves the generated events as the Arrow
tables a store's ``read`` returns (pure logic, no server)."""

from __future__ import annotations

import math
from collections import Counter

import numpy as np
import pyarrow as pa
from hypothesis import given, settings
from hypothesis import strategies as st

from pipeline.refresh.history import events_of, fold_in_inputs
from pipeline.training.trainers.altsvm_data import COLUMNS, collaborative

ITEMS = list("abcdefg")
USERS = ["u1", "u2", "u3"]
SCALE = (1.0, 5.0)
MIN_RATING = 4.0
KINDS = ("rating", "interaction", "comparison")


class Tables:
    """The part of an event store ``collaborative`` reads: every event, one table per kind."""

    def __init__(self, tables: dict):
        self.tables = tables

    def next_offsets(self, kinds=None) -> dict:
        return {k: self.tables[k].num_rows for k in kinds or self.tables}

    def read(self, kind, end_offsets=None, columns=None) -> pa.Table:
        table = self.tables[kind]
        return table.select(columns) if columns else table


event = st.one_of(
    st.tuples(st.just("rating"), st.sampled_from(USERS), st.sampled_from(ITEMS),
              st.sampled_from([-1.0, 1.0, 2.0, 3.0, 4.0, 4.5, 5.0, 9.0]), st.integers(0, 6)),
    st.tuples(st.just("interaction"), st.sampled_from(USERS), st.sampled_from(ITEMS),
              st.none(), st.integers(0, 6)),
    st.tuples(st.just("comparison"), st.sampled_from(USERS),
              st.tuples(st.sampled_from(ITEMS), st.sampled_from(ITEMS)).filter(
                  lambda p: p[0] != p[1]),
              st.sampled_from(["e1", "e2", "e3", "e4"]), st.integers(0, 6)))


def _tables(history: list) -> dict:
    """Each kind's table; ``offset`` is the event's place in the history (unique, as in a
    store), ``ts`` the generated time (repeats and disorder on purpose). A comparison id names
    one user's event (a re-sent copy may carry other items, not another user)."""
    rows = {k: [] for k in KINDS}
    for offset, (kind, user, what, value, ts) in enumerate(history):
        if kind == "comparison":
            rows[kind].append({"ts": ts, "offset": offset, "event_id": f"{user}-{value}",
                               "user": user, "winner": what[0], "loser": what[1]})
        else:
            row = {"ts": ts, "offset": offset, "user": user, "item": what}
            if kind == "rating":
                row["rating"] = value
            rows[kind].append(row)
    types = {"ts": pa.int64(), "offset": pa.int64(), "user": pa.string(), "item": pa.string(),
             "rating": pa.float64(), "event_id": pa.string(), "winner": pa.string(),
             "loser": pa.string()}
    return {k: pa.table({c: pa.array([r[c] for r in rows[k]], types[c]) for c in COLUMNS[k]})
            for k in KINDS}


def _training(tables: dict) -> dict:
    """Per user (id): met items, winning items, comparison pairs (item ids), as training's
    dataset builder counts them."""
    data = collaborative(Tables(tables), KINDS, split="random", fraction=0.0, holdout=0,
                         comparisons="explicit", rating_range=list(SCALE),
                         relevance=MIN_RATING, implicit_min_rating="relevance")
    users, items = list(data.users.ids), list(data.items.ids)
    met, out = data.met, {}
    for u, i, r in zip(met["user"], met["item"], met["rating"]):
        got = out.setdefault(users[u], {"seen": set(), "winners": set(), "pairs": Counter()})
        got["seen"].add(items[i])
        if math.isnan(r) or r >= MIN_RATING:
            got["winners"].add(items[i])
    for u, w, lo in data.comparison_events:
        got = out.setdefault(users[u], {"seen": set(), "winners": set(), "pairs": Counter()})
        got["pairs"][(items[w], items[lo])] += 1
    return out


def _refresher(tables: dict) -> dict:
    """The same, as the refresher's fold-in inputs count each user's events."""
    index = {item: n for n, item in enumerate(ITEMS)}
    spec = {"min_rating": MIN_RATING, "rating_range": list(SCALE), "comparisons": "implicit"}
    per_user: dict = {}
    for kind in KINDS:
        for user, e in events_of(kind, tables[kind]):
            per_user.setdefault(user, []).append(e)
    out = {}
    for user, events in per_user.items():
        got = fold_in_inputs(events, index.get, spec)
        out[user] = {"seen": {ITEMS[i] for i in got.seen},
                     "winners": {ITEMS[i] for i in got.winners},
                     "pairs": Counter((ITEMS[w], ITEMS[lo]) for w, lo in got.pairs)}
    return out


def _nonempty(per_user: dict) -> dict:
    return {u: v for u, v in per_user.items() if v["seen"] or v["pairs"]}


@settings(max_examples=1000, deadline=None)
@given(st.lists(event, min_size=1, max_size=30))
def test_training_and_the_refresher_count_a_users_events_alike(history):
    tables = _tables(history)
    assert _nonempty(_training(tables)) == _nonempty(_refresher(tables))


def test_an_edited_comparison_counts_as_its_latest_copy_in_both():
    history = [("comparison", "u1", ("a", "b"), "e1", 5),
               ("comparison", "u1", ("c", "b"), "e1", 7),     # the same id, re-sent edited
               ("comparison", "u1", ("d", "e"), "e1", 6)]     # an older copy, read later
    tables = _tables(history)
    for per_user in (_training(tables), _refresher(tables)):
        assert per_user["u1"]["pairs"] == Counter({("c", "b"): 1}), per_user
    assert np.array_equal(sorted(_training(tables)), sorted(_refresher(tables)))
