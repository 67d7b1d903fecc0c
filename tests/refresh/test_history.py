"""A user's history as the refresher counts it: the latest rating per item wins, comparisons
count once, ratings outside the scale are left out, and only the version's items count; the
refresher's folded history equals the reference over the plain events, and holds a row per
item, not per event."""

from __future__ import annotations

import math

import pyarrow as pa
import pytest

from pipeline.refresh.events import Event, bounds_of, events_of, fold_in_inputs
from pipeline.refresh.history import UserHistory
from pipeline.refresh.refresher import input_rules

ITEMS = {"a": 0, "b": 1, "c": 2, "d": 3}


def rating(item, r, ts, offset=0):
    return Event("rating", item, None, float(r), ts, offset)


def test_the_latest_rating_of_an_item_wins_and_decides_if_it_wins():
    events = [rating("a", 5, 1), rating("a", 2, 2), rating("b", 4, 1), rating("c", 1, 1)]
    got = fold_in_inputs(events, ITEMS.get, {"min_rating": 4.0})
    assert got.seen.tolist() == [0, 1, 2] and got.winners.tolist() == [1]


def test_equal_times_are_ordered_by_offset():
    events = [rating("a", 5, 7, offset=3), rating("a", 1, 7, offset=2)]
    assert fold_in_inputs(events, ITEMS.get, {"min_rating": 4.0}).winners.tolist() == [0]


def test_interactions_win_and_unknown_items_are_skipped():
    events = [Event("interaction", "d", None, math.nan, 1, 0), rating("zzz", 5, 1)]
    got = fold_in_inputs(events, ITEMS.get, {"min_rating": 4.0})
    assert got.seen.tolist() == [3] and got.winners.tolist() == [3]


def test_ratings_outside_the_scale_are_left_out_before_the_latest_is_taken():
    events = [rating("a", 5, 1), rating("a", -3, 2)]
    got = fold_in_inputs(events, ITEMS.get, {"min_rating": 4.0, "rating_range": [1, 5]})
    assert got.winners.tolist() == [0]


def test_a_comparison_counts_once_and_explicit_mode_adds_rating_pairs():
    c = Event("comparison", "a", "b", math.nan, 1, 0, "e1")
    events = [c, c, rating("c", 5, 1), rating("d", 3, 1), rating("a", 3, 1)]
    implicit = fold_in_inputs(events, ITEMS.get, {"min_rating": 4.0})
    assert implicit.pairs.tolist() == [[0, 1]]
    explicit = fold_in_inputs(events, ITEMS.get, {"min_rating": 4.0, "comparisons": "mixed"})
    assert sorted(map(tuple, explicit.pairs.tolist())) == [(0, 1), (2, 0), (2, 3)]


def test_streamed_events_the_store_holds_are_forgotten_and_the_rest_name_their_users():
    history = UserHistory()
    table = pa.table({"user": [7, 7, 8], "item": ["a", "b", "a"], "rating": [5.0, 1.0, 4.0],
                      "ts": [1, 2, 3], "offset": [10, 11, 12]})
    assert history.add("rating", table, ("t", 0)) == {"7", "8"}
    assert history.unstored_users(lambda src: None) == {"7", "8"}
    assert history.unstored_users(lambda src: 12) == {"8"}   # the store holds offsets < 12 now
    assert history.unstored_users(lambda src: 13) == set()
    # what was folded stays: the store's copies fold in again to the same
    got = history.inputs("7", ITEMS.get, {"min_rating": 4.0})
    assert got.seen.tolist() == [0, 1] and got.winners.tolist() == [0]


@pytest.mark.parametrize("spec, expected", [
    ({"method": "pairwise", "min_rating": 4.0}, 4.0),
    ({"method": "blend", "parts": [{"method": "pairwise", "min_rating": 3.5},
                                    {"method": "least_squares"}]}, 3.5),
])
def test_a_blend_counts_events_as_its_first_part(spec, expected):
    assert input_rules(spec)["min_rating"] == expected


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("spec", [{"min_rating": 4.0},
                                  {"min_rating": 3.0, "rating_range": [1, 5],
                                   "comparisons": "mixed", "max_pairs_per_user": 3}])
@pytest.mark.parametrize("window", [{}, {"last_days": 0}, {"last_events": 15}])
def test_the_kept_digest_equals_the_whole_history_read_again(seed, spec, window):
    """``UserHistory.inputs`` adds only the events since its last call: after any run of
    adds, after the store is read again, and as the window moves (times here are ms, so
    ``last_days`` 0 keeps the newest time only), it equals :func:`fold_in_inputs` of the
    whole history (the reference)."""
    import numpy as np

    rng = np.random.default_rng(seed)
    items = list(ITEMS) + ["zzz"]

    def table(n, offset):
        return pa.table({"user": rng.choice(["7", "8"], n).tolist(),
                         "item": rng.choice(items, n).tolist(),
                         "rating": rng.choice([-2.0, 1.0, 3.0, 4.0, 5.0, 9.0], n).tolist(),
                         "ts": rng.integers(0, 5, n).tolist(),
                         "offset": list(range(offset, offset + n))})

    class Store:    # a stored table, as UserHistory.load_store reads it
        def __init__(self, t):
            self.t = t

        def read(self, kind, columns):
            return self.t if kind == "rating" else self.t.slice(0, 0)

    history = UserHistory(bounds_of(spec), window)
    stored = table(20, 0)
    history.load_store(Store(stored), ["rating"])
    every = {u: [] for u in ("7", "8")}        # the whole history, plain: the reference's

    def met(kind, t, source=None):
        for user, event in events_of(kind, t, source):
            every[user].append(event)

    met("rating", stored)
    offset = 100
    for step in range(8):
        ratings = table(int(rng.integers(0, 6)), offset)
        history.add("rating", ratings, ("t", 0))
        met("rating", ratings)
        comparison = pa.table({"user": ["7"], "winner": [rng.choice(items)],
                               "loser": [rng.choice(items)], "ts": [step], "offset": [offset],
                               "event_id": [f"c{rng.integers(0, 3)}"]})
        history.add("comparison", comparison, ("t", 1))
        met("comparison", comparison)
        offset += 10
        if step == 5:       # a new version: the store read again, its copies folded in again
            history.load_store(Store(stored), ["rating"])
            history.unstored_users(lambda src: 120)
        start = history.window_start()
        for user in ("7", "8"):
            want = fold_in_inputs(every[user], ITEMS.get, spec, user, start)
            got = history.inputs(user, ITEMS.get, spec, start=start)
            for name in ("seen", "winners", "pairs"):
                assert getattr(got, name).tolist() == getattr(want, name).tolist(), name


def test_a_count_window_is_found_again_once_one_percent_of_it_arrived():
    """``last_events``: the start over every time held is found again once 1% of the window
    arrived since (a pass over the times per 1%, not per batch), and is then exact; the start
    of ``last_days`` follows the newest time at once."""
    import numpy as np

    from pipeline.training.datasets import DAY_MS, window_start

    def ratings(ts, first_offset):
        return pa.table({"user": ["7"] * len(ts), "item": ["a"] * len(ts),
                         "rating": [5.0] * len(ts), "ts": list(ts),
                         "offset": list(range(first_offset, first_offset + len(ts)))})

    class Store:
        def read(self, kind, columns):
            return ratings(range(0, 2000), 0) if kind == "rating" else ratings([], 0)

    window = {"last_events": 1000}
    history, by_days = UserHistory(window=window), UserHistory(window={"last_days": 1})
    for h in (history, by_days):
        h.load_store(Store(), ["rating"])
    assert history.window_start() == 1000
    for h in (history, by_days):
        h.add("rating", ratings(range(5000, 5009), 9000))      # 9 of the 10 that move it
    assert history.window_start() == 1000
    for h in (history, by_days):
        h.add("rating", ratings([5009], 9009))
    every = np.concatenate([np.arange(2000), np.arange(5000, 5010)])
    assert history.window_start() == window_start(every, window) == 1010
    assert by_days.window_start() == 5009 - DAY_MS
    by_days.load_store(Store(), ["rating"])          # the streamed times outlive a store read
    assert by_days.window_start() == 5009 - DAY_MS and by_days.unstored_times == []


def test_a_user_holds_a_row_per_item_however_many_events_and_copies_came():
    # the refresher's memory grows with its users' items, not with the events it streamed
    history = UserHistory()
    n = 3000
    for copy in range(2):      # every event twice: a replay, or the store's copy
        table = pa.table({"user": ["u1"] * n, "item": [f"i{k % 50}" for k in range(n)],
                          "rating": [float(k % 5 + 1) for k in range(n)],
                          "ts": list(range(n)), "offset": list(range(n))})
        history.add("rating", table, ("t", 0))
    latest = {f"i{k % 50}": float(k % 5 + 1) for k in range(n)}
    got = history.inputs("u1", lambda item: int(item[1:]), {"min_rating": 5.0})
    assert len(history.rated["u1"]) == 50 and len(history.items) == 50
    assert history.arrived == {}
    assert got.winners.tolist() == sorted(int(i[1:]) for i, r in latest.items() if r >= 5.0)
    assert [len(a) for a in history.unstored[("t", 0)].rows()] == [1, 1]   # one user, one row
    assert history.unstored_users(lambda src: n) == set()
    assert history.unstored == {}


def test_the_scale_is_the_versions_and_a_new_one_starts_the_fold_again():
    history = UserHistory((1.0, 5.0))
    table = pa.table({"user": ["u"] * 2, "item": ["a", "a"], "rating": [5.0, 9.0],
                      "ts": [1, 2], "offset": [0, 1]})
    history.add("rating", table)
    spec = {"min_rating": 4.0, "rating_range": [1, 5]}
    assert history.inputs("u", ITEMS.get, spec).winners.tolist() == [0]   # 9 left out first
    with pytest.raises(ValueError, match="use_bounds"):
        history.inputs("u", ITEMS.get, {"min_rating": 4.0})
    assert history.use_bounds((1.0, 5.0)) is False
    assert history.use_bounds((-math.inf, math.inf)) is True and history.rated == {}


@pytest.mark.parametrize("seed", range(20))
def test_folding_rows_in_equals_taking_the_latest_of_all_of_them_at_once(seed):
    import numpy as np

    from pipeline.refresh.history import RATED, _merged
    from pipeline.training.datasets import latest_per_key

    rng = np.random.default_rng(seed)

    def rows(n):
        out = np.empty(n, RATED)
        out["code"] = rng.integers(0, 12, n)
        out["rating"] = rng.integers(1, 6, n)
        out["ts"], out["offset"] = rng.integers(0, 4, n), rng.integers(0, 3, n)   # ties
        return out

    held, every = None, np.zeros(0, RATED)
    for _ in range(6):
        new = rows(int(rng.integers(0, 8)))
        every = np.concatenate([every, new])
        held = _merged(held, new.copy())
        want = every[latest_per_key(every["code"], every["ts"], every["offset"])]
        want = want[np.argsort(want["code"], kind="stable")]
        assert held.tolist() == want.tolist()


@pytest.mark.parametrize("seed", range(10))
def test_the_users_the_store_lacks_are_those_with_an_event_past_its_offsets(seed):
    """The streamed log keeps one largest offset per (source, user): the users it names after
    any run of adds and store catch-ups are those of the plain log of every event."""
    import numpy as np

    rng = np.random.default_rng(seed)
    history, plain = UserHistory(), []         # plain: (source, user, offset) per event
    stored = {("t", 0): 0, ("t", 1): 0}
    for step in range(30):
        source = [("t", 0), ("t", 1), None][int(rng.integers(0, 3))]
        n = int(rng.integers(1, 3000))
        users = [f"u{k}" for k in rng.integers(0, 50, n)]
        offsets = rng.integers(0, 10_000, n)
        history.add("rating", pa.table({"user": users, "item": ["a"] * n, "rating": [1.0] * n,
                                        "ts": [step] * n, "offset": offsets.tolist()}), source)
        plain += [(source, u, int(o)) for u, o in zip(users, offsets)]
        if rng.random() < 0.3:
            for s in stored:
                stored[s] = max(stored[s], int(rng.integers(0, 10_000)))
            plain = [(s, u, o) for s, u, o in plain if s is None or o >= stored[s]]
            assert history.unstored_users(stored.get) == {u for _, u, _ in plain}
