"""The refresher and training count a user's events by one rule (issue 53): random histories
(repeated items and comparison ids, equal and out-of-order times, ratings off the scale,
interactions after ratings), windows and caps on rating pairs go through training's dataset
builder (:func:`~pipeline.training.trainers.altsvm_data.collaborative`) and through the
refresher's history (:meth:`~pipeline.refresh.history.UserHistory.inputs`, in the version's
item indices: training's); every user's met items, winning items and comparison pairs (the
comparison events and the rating pairs kept) must be the same.

Training reads an event store: here a stand-in that serves the generated events as the Arrow
tables a store's ``read`` returns (pure logic, no server)."""

from __future__ import annotations

import math
from collections import Counter

import numpy as np
import pyarrow as pa
from hypothesis import given, settings
from hypothesis import strategies as st

from pipeline.refresh.events import bounds_of
from pipeline.refresh.history import UserHistory
from pipeline.training.datasets import DAY_MS
from pipeline.training.trainers.altsvm_data import COLUMNS, collaborative
from solvers.pairs import popularity_cum

ITEMS = list("abcdefg")
USERS = ["u1", "u2", "u3"]
SCALE = (1.0, 5.0)
MIN_RATING = 4.0
KINDS = ("rating", "interaction", "comparison")
SEED = 3


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
# the model's window (times are days here) and its cap on a user's rating pairs
windows = st.sampled_from([{}, {"last_days": 0}, {"last_days": 2}, {"last_days": 5},
                           {"last_events": 1}, {"last_events": 4}, {"last_events": 12}])
caps = st.sampled_from([None, 1, 2, 5])


def _tables(history: list) -> dict:
    """Each kind's table; ``offset`` is the event's place in the history (unique, as in a
    store), ``ts`` the generated day (repeats and disorder on purpose). A comparison id names
    one user's event (a re-sent copy may carry other items, not another user)."""
    rows = {k: [] for k in KINDS}
    for offset, (kind, user, what, value, day) in enumerate(history):
        ts = day * DAY_MS
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


def _training(tables: dict, window: dict, cap) -> tuple[dict, list]:
    """Per user (id): met items, winning items, comparison pairs (item ids), as training's
    dataset builder counts them; and its items (the version's item indices)."""
    data = collaborative(Tables(tables), KINDS, window=window, split="random", fraction=0.0,
                         holdout=0, comparisons="explicit", rating_range=list(SCALE),
                         relevance=MIN_RATING, implicit_min_rating="relevance",
                         max_pairs_per_user=cap, seed=SEED)
    users, items = list(data.users.ids), list(data.items.ids)
    met, out = data.met, {}
    for u, i, r in zip(met["user"], met["item"], met["rating"]):
        got = out.setdefault(users[u], {"seen": set(), "winners": set(), "pairs": Counter()})
        got["seen"].add(items[i])
        if math.isnan(r) or r >= MIN_RATING:
            got["winners"].add(items[i])
    for u, w, lo in data.comparisons:        # the rating pairs kept and comparison events
        got = out.setdefault(users[u], {"seen": set(), "winners": set(), "pairs": Counter()})
        got["pairs"][(items[w], items[lo])] += 1
    return out, items


def _refresher(tables: dict, window: dict, cap, items: list) -> dict:
    """The same, as the refresher's history counts each user's events (streamed in, in
    the version's item indices ``items``)."""
    index = {item: n for n, item in enumerate(items)}
    spec = {"min_rating": MIN_RATING, "rating_range": list(SCALE), "comparisons": "explicit",
            "max_pairs_per_user": cap, "seed": SEED}
    history = UserHistory(bounds_of(spec), window)
    for kind in KINDS:
        history.add(kind, tables[kind])
    start = history.window_start()
    out = {}
    for user in history.users():
        got = history.inputs(user, index.get, spec, start=start)
        out[user] = {"seen": {items[i] for i in got.seen},
                     "winners": {items[i] for i in got.winners},
                     "pairs": Counter((items[w], items[lo]) for w, lo in got.pairs)}
    return out


def _nonempty(per_user: dict) -> dict:
    return {u: v for u, v in per_user.items() if v["seen"] or v["pairs"]}


def _both(history: list, window: dict | None = None, cap=None) -> tuple[dict, dict]:
    tables = _tables(history)
    training, items = _training(tables, window or {}, cap)
    return _nonempty(training), _nonempty(_refresher(tables, window or {}, cap, items))


@settings(max_examples=1000, deadline=None)
@given(st.lists(event, min_size=1, max_size=30), windows, caps)
def test_training_and_the_refresher_count_a_users_events_alike(history, window, cap):
    training, refresher = _both(history, window, cap)
    assert training == refresher


def test_a_cap_keeps_the_same_rating_pairs_in_both():
    """Five ratings of one user make 10 pairs; a cap of 3 keeps the 3 training keeps."""
    history = [("rating", "u1", item, value, 1)
               for item, value in zip("abcde", (1.0, 2.0, 3.0, 4.0, 5.0))]
    training, refresher = _both(history, cap=3)
    assert sum(training["u1"]["pairs"].values()) == 3
    assert training == refresher
    assert _both(history)[0]["u1"]["pairs"] != training["u1"]["pairs"]   # the cap is on


def test_a_window_leaves_the_same_events_out_of_both():
    history = [("rating", "u1", "a", 5.0, 0), ("rating", "u1", "b", 5.0, 3),
               ("rating", "u2", "a", 2.0, 6), ("interaction", "u1", "c", None, 6)]
    training, refresher = _both(history, {"last_days": 3})
    assert training == refresher
    assert training["u1"]["seen"] == {"b", "c"}     # day 0 is 6 days before the newest


def test_an_edited_comparison_counts_as_its_latest_copy_in_both():
    history = [("comparison", "u1", ("a", "b"), "e1", 5),
               ("comparison", "u1", ("c", "b"), "e1", 7),     # the same id, re-sent edited
               ("comparison", "u1", ("d", "e"), "e1", 6)]     # an older copy, read later
    training, refresher = _both(history)
    for per_user in (training, refresher):
        assert per_user["u1"]["pairs"] == Counter({("c", "b"): 1}), per_user
    assert training == refresher


@settings(max_examples=300, deadline=None)
@given(st.lists(event, min_size=1, max_size=30), st.sampled_from([1, 4, 10, 25]),
       st.sampled_from([0, 2, 3]), st.sampled_from(["uniform", "popularity"]))
def test_the_fold_ins_implicit_comparisons_follow_trainings_rule(history, per_user, cap,
                                                                  sampling):
    """Implicit comparisons are drawn, not listed, and each side draws its own (training by
    the user's index, the fold-in by their items); the rule is one: the same winners, as
    many comparisons per user (``implicit_per_user`` spread over the winners, at most
    ``implicit_max_per_positive`` each, trimmed to ``per_user``), no met item a loser, losers
    drawn uniformly or both by the counts training drew by (``loser_counts``, published)."""
    from types import SimpleNamespace

    from pipeline.serving.item_queries import PairwiseFoldIn

    # a user who met 40 more items at low ratings: a catalogue where a draw never fails
    filler = [("rating", "u0", f"x{n}", 1.0, 0) for n in range(40)]
    tables = _tables(filler + history)
    data = collaborative(Tables(tables), KINDS, split="random", fraction=0.0, holdout=0,
                         rating_range=list(SCALE), relevance=MIN_RATING,
                         implicit_min_rating="relevance", implicit_per_user=per_user,
                         implicit_max_per_positive=cap, implicit_sampling=sampling, seed=SEED)
    users, items = list(data.users.ids), list(data.items.ids)
    version = SimpleNamespace(n_items=len(items), loser_cum=None if data.loser_counts is None
                              else popularity_cum(data.loser_counts, len(items)))
    training: dict = {}
    for u, w, lo in data.comparisons:
        training.setdefault(users[u], []).append((items[w], items[lo]))
    index = {item: n for n, item in enumerate(items)}
    spec = {"min_rating": MIN_RATING, "rating_range": list(SCALE), "per_user": per_user,
            "sampling": sampling, **({"max_per_positive": cap} if cap else {})}
    history_ = UserHistory(bounds_of(spec))
    for kind in KINDS:
        history_.add(kind, tables[kind])
    refresher = {}
    for user in history_.users():
        got = history_.inputs(user, index.get, spec)
        drawn = PairwiseFoldIn.drawn(version, [got.winners], spec, seen=[got.seen])[0]
        if len(drawn):
            refresher[user] = [(items[w], items[lo]) for w, lo in drawn]
        assert not np.isin(drawn[:, 1], got.seen).any()
    met, wins = {}, {}
    for u, i, r in zip(data.met["user"], data.met["item"], data.met["rating"]):
        met.setdefault(users[u], set()).add(items[i])
        if math.isnan(r) or r >= MIN_RATING:
            wins.setdefault(users[u], set()).add(items[i])
    assert {u: len(p) for u, p in training.items()} == {u: len(p) for u, p in refresher.items()}
    for user, pairs in training.items():   # which winners a trimmed user keeps is each hash's
        assert {w for w, _ in pairs} <= wins[user] and {w for w, _ in refresher[user]} <= wins[user]
        assert not {lo for _, lo in pairs} & met[user]
