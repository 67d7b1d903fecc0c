"""The refresher's watchdog on its consumer group (pure logic, a stand-in consumer): a
rebalance that began (partitions revoked) and was never finished (no assignment) is given up
after ``REJOIN_SECONDS``: the consumer is closed, the loop joins again, and the metrics count
it. Seen with kafka-python 3.0.12 against a real broker: a second generation's assignment that
never came, the refresher reading nothing for good. Likewise a member that holds no partition
of topics that have some for ``ORPHAN_SECONDS`` (seen in the Kafka refresh tests: a refresher
that refreshed nobody and said nothing) joins again, waiting twice as long the next time."""

from __future__ import annotations

import threading
import time
from types import SimpleNamespace

import pytest

from pipeline.refresh import kafka_source
from pipeline.refresh.kafka_source import KafkaRefresh, StalledRebalance
from pipeline.refresh.stats import RefreshStats


class _Consumer:
    """Polls come back empty; the first one starts a rebalance that never finishes."""

    def __init__(self, loop, finish_after: int | None = None, held=("t-0",), partitions=(0,),
                 rebalance: bool = True):
        self.loop, self.polls, self.finish_after = loop, 0, finish_after
        self.held, self.partitions, self.rebalance = set(held), set(partitions), rebalance
        self.closed = False
        self.ids = {"t": "id-1"}                 # topic -> its topic id, as the metadata says
        self._client = SimpleNamespace(cluster=SimpleNamespace(topic_id=self.ids.get))

    def assignment(self):
        return self.held

    def partitions_for_topic(self, topic):
        return self.partitions

    def poll(self, timeout_ms, max_records):
        self.polls += 1
        if self.polls == 1 and self.rebalance:
            self.loop.revoked_at = time.monotonic()          # on_partitions_revoked
        if self.finish_after is not None and self.polls == self.finish_after:
            self.loop.revoked_at = None                      # on_partitions_assigned
        time.sleep(timeout_ms / 1000)
        return {}

    def close(self, autocommit=False):
        self.closed = True


def _loop(monkeypatch, finish_after=None, **consumer_args):
    refresher = SimpleNamespace(model="movies", stats=RefreshStats("movies"), pending=False,
                                replay=set(), watch=lambda: "same", flush=lambda: False)
    settings = SimpleNamespace(home=None, kafka_bootstrap="127.0.0.1:1", kafka_security={})
    loop = KafkaRefresh(refresher, settings, topics={"t": "rating"}, group="g")
    consumer = _Consumer(loop, finish_after, **consumer_args)
    monkeypatch.setattr(loop, "_consumer", lambda member: consumer)
    monkeypatch.setattr(refresher.stats, "write", lambda home: None)
    monkeypatch.setattr(kafka_source, "REJOIN_SECONDS", 0.3)
    monkeypatch.setattr(kafka_source, "WATCH_SECONDS", 0.05)
    monkeypatch.setattr(kafka_source, "ORPHAN_SECONDS", 0.3)
    loop.orphan_wait = 0.3
    return loop, consumer


def test_a_rebalance_that_never_finishes_is_given_up_and_counted(monkeypatch):
    loop, consumer = _loop(monkeypatch)
    started = time.monotonic()
    with pytest.raises(StalledRebalance, match="did not finish in 0.3 s; joining it again"):
        loop._run("member-0")
    assert 0.3 <= time.monotonic() - started < 5.0
    assert loop.refresher.stats.rejoins == 1
    assert loop.refresher.stats.to_json()["rejoins"] == 1


def test_a_rebalance_that_finishes_keeps_the_consumer(monkeypatch):
    loop, consumer = _loop(monkeypatch, finish_after=3)
    threading.Timer(1.0, loop.stop.set).start()
    loop._run("member-0")                  # stops when told, nothing raised
    assert consumer.closed and loop.refresher.stats.rejoins == 0 and consumer.polls > 10


def test_a_member_left_without_partitions_joins_again_and_waits_longer_each_time(monkeypatch):
    loop, consumer = _loop(monkeypatch, held=(), rebalance=False)
    started = time.monotonic()
    with pytest.raises(StalledRebalance, match=r"held no partition of t for 0.3 s while they "
                                               r"have some; joining group g again"):
        loop._run("member-0")
    assert 0.3 <= time.monotonic() - started < 5.0
    assert loop.refresher.stats.rejoins == 1 and loop.orphan_wait == 0.6
    with pytest.raises(StalledRebalance, match="for 0.6 s"):
        loop._run("member-0")
    assert loop.refresher.stats.rejoins == 2 and loop.orphan_wait == 1.2


def test_a_topic_created_again_under_a_member_is_read_again_from_its_start(monkeypatch):
    """Its partitions were kept through the deletion (no rebalance): the member would read on
    from the old topic's end, past the new topic's first events. A new topic id says it."""
    loop, consumer = _loop(monkeypatch, rebalance=False)
    threading.Timer(0.5, lambda: consumer.ids.update(t="id-2")).start()
    started = time.monotonic()
    with pytest.raises(StalledRebalance, match=r"^t was deleted and created again \(a new "
                                               r"topic id\); joining group g again"):
        loop._run("member-0")
    assert 0.5 <= time.monotonic() - started < 5.0 and loop.refresher.stats.rejoins == 1
    consumer.polls = 0
    threading.Timer(1.0, loop.stop.set).start()
    loop._run("member-0")                  # the same id again: it stays
    assert loop.refresher.stats.rejoins == 1


@pytest.mark.parametrize("held,partitions", [(("t-0",), (0,)), ((), ())],
                         ids=["holding a partition", "topic without partitions"])
def test_a_member_with_partitions_or_a_topic_without_any_stays(monkeypatch, held, partitions):
    loop, consumer = _loop(monkeypatch, held=held, partitions=partitions, rebalance=False)
    threading.Timer(1.0, loop.stop.set).start()
    loop._run("member-0")
    assert consumer.closed and loop.refresher.stats.rejoins == 0
