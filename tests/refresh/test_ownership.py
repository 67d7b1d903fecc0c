"""Which users a refresher holds: the partition of a user key is Kafka's default
partitioner's (kafka-python's murmur2, the Java client's rule), an assignment of every
partition holds everyone, and a history loaded for some users only, or told to forget the
others, gives those users the inputs a whole load gives them."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
from hypothesis import given, settings
from hypothesis import strategies as st

from pipeline.refresh.events import bounds_of
from pipeline.refresh.history import UserHistory
from pipeline.refresh.ownership import Ownership, partitions_of

ITEMS = {f"i{n}": n for n in range(12)}


@settings(max_examples=300, deadline=None)
@given(keys=st.lists(st.one_of(st.text(min_size=1, max_size=40),
                               st.integers(0, 2**63).map(str)), min_size=1, max_size=20),
       n=st.integers(1, 97))
def test_a_keys_partition_is_kafkas_default_partitioners(keys, n):
    from kafka.partitioner.default import murmur2

    want = [(murmur2(k.encode("utf-8", "replace")) & 0x7FFFFFFF) % n for k in keys]
    assert partitions_of(keys, n).tolist() == want


def test_every_partition_holds_everyone_and_some_hold_theirs():
    assert Ownership.of({"r": {0, 1, 2}}, {"r": 3}) is None
    assert Ownership.of({"r": {0, 1, 2}, "i": {0}}, {"r": 3, "i": 3}) is None
    keys = [str(n) for n in range(200)]
    halves = [Ownership.of({"r": {0, 2}}, {"r": 4}), Ownership.of({"r": {1, 3}}, {"r": 4})]
    owned = [h.owns(keys) for h in halves]
    assert (owned[0] ^ owned[1]).all()          # each key held by exactly one
    assert 60 < owned[0].sum() < 140
    at = partitions_of(keys, 4)
    here, there = keys[int(np.flatnonzero(at == 0)[0])], keys[int(np.flatnonzero(at == 1)[0])]
    assert halves[0].strays([here, there], "r", 0) == [there]     # read from partition 0
    assert halves[0].strays([there], "other topic", 0) == []


def test_a_history_of_some_users_gives_them_what_a_whole_one_does():
    rng = np.random.default_rng(3)
    users = [str(n) for n in range(40)]
    n = 600
    stored = pa.table({"user": rng.choice(users, n).tolist(),
                       "item": rng.choice(list(ITEMS), n).tolist(),
                       "rating": rng.choice([1.0, 2.0, 4.0, 5.0], n).tolist(),
                       "ts": rng.integers(0, 50, n).tolist(), "offset": list(range(n))})

    class Store:
        def read(self, kind, columns):
            return stored if kind == "rating" else stored.slice(0, 0)

    spec = {"min_rating": 4.0, "rating_range": [1, 5]}
    whole, some, shrunk = (UserHistory(bounds_of(spec)) for _ in range(3))
    mine = Ownership.of({"r": {1}}, {"r": 3})
    assert whole.load_store(Store(), ["rating"]) == some.load_store(
        Store(), ["rating"], keep=mine.owns) == n     # every stored event counts for a window
    shrunk.load_store(Store(), ["rating"])
    gone = shrunk.forget(mine.owns)
    held = set(np.array(users)[mine.owns(users)].tolist())
    assert some.users() == shrunk.users() == held and gone == len(users) - len(held)
    for user in sorted(held):
        want = whole.inputs(user, ITEMS.get, spec)
        for history in (some, shrunk):
            got = history.inputs(user, ITEMS.get, spec)
            for name in ("seen", "winners", "pairs"):
                assert getattr(got, name).tolist() == getattr(want, name).tolist(), name


def test_an_assignment_within_another_holds_no_one_new():
    whole = Ownership.of({"r": {0, 1}}, {"r": 4})
    assert Ownership.of({"r": {1}}, {"r": 4}).within(whole)
    assert not whole.within(Ownership.of({"r": {1}}, {"r": 4}))
    assert not Ownership.of({"r": {1}}, {"r": 5}).within(whole)     # repartitioned: rehashed
    assert whole.within(None)
