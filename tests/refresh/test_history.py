"""A user's history as the refresher counts it: the latest rating per item wins, comparisons
count once, ratings outside the scale are left out, and only the version's items count."""

from __future__ import annotations

import math

import pyarrow as pa
import pytest

from pipeline.refresh.history import Event, UserHistory, fold_in_inputs
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


def test_streamed_events_join_the_stored_ones_and_leave_once_stored():
    history = UserHistory()
    table = pa.table({"user": [7, 7, 8], "item": ["a", "b", "a"], "rating": [5.0, 1.0, 4.0],
                      "ts": [1, 2, 3], "offset": [10, 11, 12]})
    assert history.add("rating", table, ("t", 0)) == {"7", "8"}
    assert [e.item for e in history.of("7")] == ["a", "b"]
    history.forget_stored(lambda src: 12)        # the store holds offsets < 12 now
    assert history.of("7") == [] and [e.item for e in history.of("8")] == ["a"]


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

    history = UserHistory()
    history.load_store(Store(table(20, 0)), ["rating"])
    offset = 100
    for step in range(8):
        history.add("rating", table(int(rng.integers(0, 6)), offset), ("t", 0))
        comparison = pa.table({"user": ["7"], "winner": [rng.choice(items)],
                               "loser": [rng.choice(items)], "ts": [step], "offset": [offset],
                               "event_id": [f"c{rng.integers(0, 3)}"]})
        history.add("comparison", comparison, ("t", 1))
        offset += 10
        if step == 5:
            history.forget_stored(lambda src: 120)
        start = history.window_start(window)
        for user in ("7", "8"):
            want = fold_in_inputs(history.of(user), ITEMS.get, spec, user, start)
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

    history, window = UserHistory(), {"last_events": 1000}
    history.load_store(Store(), ["rating"])
    assert history.window_start(window) == 1000
    history.add("rating", ratings(range(5000, 5009), 9000))      # 9 of the 10 that move it
    assert history.window_start(window) == 1000
    history.add("rating", ratings([5009], 9009))
    every = np.concatenate([np.arange(2000), np.arange(5000, 5010)])
    assert history.window_start(window) == window_start(every, window) == 1010
    assert history.window_start({"last_days": 1}) == 5009 - DAY_MS


def test_streamed_events_are_slotted_and_share_their_ids_and_ratings():
    # the refresher holds every event of its users: one object per id, not one per row
    history = UserHistory()
    table = pa.table({"user": ["u1", "u2", "u1"], "item": ["a", "a", "b"],
                      "rating": [4.0, 4.0, 5.0], "ts": [1, 2, 3], "offset": [0, 1, 2]})
    assert history.add("rating", table, source=("t", 0)) == {"u1", "u2"}
    (a1, b1), (a2,) = history.streamed["u1"], history.streamed["u2"]
    assert a1.item is a2.item and a1.rating is a2.rating and a1.source == ("t", 0)
    assert not hasattr(a1, "__dict__")
    again = pa.table({"user": ["u3"], "item": ["b"], "rating": [5.0], "ts": [4], "offset": [3]})
    history.add("rating", again, source=("t", 0))
    assert history.streamed["u3"][0].item is b1.item
    # a version switch forgets what the store holds now and keeps the rest, ids shared still
    history.forget_stored(lambda src: 2)
    assert [e.offset for es in history.streamed.values() for e in es] == [2, 3]
