"""Rebalance: two ``rankstream ingest`` consumers of one group share a 4-partition topic and one
store; one leaves (SIGTERM) mid-stream, the other takes its partitions over. Two until-end
consumers split a 2-partition topic between them. Nothing may be lost or stored twice."""

from __future__ import annotations

import json
import random
import signal
import subprocess
import sys
import threading
import time
from collections import Counter

import pyarrow.parquet as pq

from pipeline.ingest.events import KIND_NAMES
from pipeline.ingest.kafka import new_group_id
from pipeline.ingest.local_store import LocalEventStore
from pipeline.ingest.producer import EventProducer
from pipeline.ingest.store import EventStore
from tests.ingest.factory import REPO, cli_ingest, make_event, new_topic

N_BATCHES = 60
PER_BATCH = 300


def writers(store: EventStore) -> dict[int, set[int]]:
    """Partition -> process ids that wrote segments of it."""
    out: dict[int, set[int]] = {}
    for seg in store.segments():
        meta = json.loads(pq.read_schema(seg.path).metadata[b"rankstream"])
        out.setdefault(seg.partition, set()).add(int(meta["writer"].rsplit(":", 1)[1]))
    return out


def slow_ingest(delay: float, bootstrap: str, topic: str, home, group: str,
                log: str) -> subprocess.Popen:
    """``tests/ingest/slow_ingest.py`` in a child process (until_end, DELAY s more per poll),
    its output in ``home/log``."""
    with open(home / log, "wb") as out:
        return subprocess.Popen(
            [sys.executable, "-m", "tests.ingest.slow_ingest", str(delay), bootstrap, topic,
             str(home), group], cwd=REPO, stdout=out, stderr=subprocess.STDOUT)


def child_logs(home) -> str:
    return "\n".join(p.read_text()[-2000:] for p in home.glob("*.log"))


def wait_for(condition, what: str, timeout: float, logs) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}\n" + logs())
        time.sleep(0.2)


def test_one_consumer_leaves_mid_stream(kafka_bootstrap, tmp_path):
    rng = random.Random(21)
    topic = new_topic(kafka_bootstrap, partitions=4, prefix="rebalance")
    home = tmp_path / "home"
    store = LocalEventStore(home / "store", home / "dead-letter")
    produced: list[str] = []

    def produce():                      # a steady stream for about 12 s
        with EventProducer(kafka_bootstrap, encoding="compact", batch_events=50) as producer:
            for b in range(N_BATCHES):
                for i in range(b * PER_BATCH, (b + 1) * PER_BATCH):
                    event = make_event(KIND_NAMES[i % len(KIND_NAMES)], i, rng)
                    producer.send(topic, event)
                    produced.append(event["event_id"])
                producer.flush()
                time.sleep(0.2)

    common = ("--group", new_group_id("rebalance"), "--flush-interval", "0.3",
              "--dead-letter-topic", f"dlq-{topic}")
    a = cli_ingest(home, kafka_bootstrap, topic, *common, log="a.log")
    b = None
    producer = threading.Thread(target=produce)

    def logs():
        return "\n".join(p.read_text()[-2000:] for p in home.glob("*.log"))

    try:
        producer.start()
        b = cli_ingest(home, kafka_bootstrap, topic, *common, log="b.log")
        wait_for(lambda: {a.pid, b.pid} <= set().union(*writers(store).values() or [set()]),
                 "both consumers to store segments", 90, logs)
        assert producer.is_alive(), "the stream ended before the rebalance could be tested"
        b.send_signal(signal.SIGTERM)                   # b leaves the group mid-stream
        assert b.wait(timeout=60) == 0, logs()
        assert producer.is_alive(), "the stream ended before b had left"
        producer.join(timeout=120)
        wait_for(lambda: sum(store.next_offsets().values()) >= _end(kafka_bootstrap, topic),
                 "a to catch up on all four partitions", 120, logs)
        a.send_signal(signal.SIGTERM)
        assert a.wait(timeout=60) == 0, logs()
    finally:
        for child in (a, b):
            if child is not None and child.poll() is None:
                child.kill()

    stored = Counter()
    for kind in KIND_NAMES:
        stored.update(store.read(kind, columns=["event_id"]).column("event_id").to_pylist())
    assert len(produced) == N_BATCHES * PER_BATCH
    assert stored == Counter(produced), (
        f"missing {len(set(produced) - set(stored))}, "
        f"duplicated {sum(1 for c in stored.values() if c > 1)}")
    by_partition = writers(store)
    assert len(by_partition) == 4
    assert any({a.pid, b.pid} <= pids for pids in by_partition.values()), \
        f"no partition moved from b to a: {by_partition}"
    assert "stopped: stop requested" in (home / "b.log").read_text()


def _end(bootstrap: str, topic: str, partitions: int = 4) -> int:
    from kafka import KafkaConsumer, TopicPartition

    consumer = KafkaConsumer(bootstrap_servers=bootstrap)
    try:
        parts = [TopicPartition(topic, p) for p in range(partitions)]
        return sum(consumer.end_offsets(parts).values())
    finally:
        consumer.close()


def test_two_until_end_processes_share_a_two_partition_topic_exactly_once(kafka_bootstrap,
                                                                        tmp_path):
    """Two ``ingest_kafka(until_end=True)`` processes of one group drain a 2-partition topic
    (compact batches and JSON messages) into one store. The first runs as on a slow machine
    (tests/ingest/slow_ingest.py), so it is mid-stream when the second joins and the rebalance
    splits its partitions. Each event is stored exactly once, both processes store some, their
    summaries add up to the topic, and the store ends at the topic's end offsets."""
    topic = new_topic(kafka_bootstrap, partitions=2, prefix="two-until-end")
    produced = [f"ev-{i}" for i in range(12_000)]
    rng = random.Random(5)
    for encoding, part in (("compact", produced[:6_000]), ("json", produced[6_000:])):
        with EventProducer(kafka_bootstrap, encoding=encoding, batch_events=100) as producer:
            for i, event_id in enumerate(part):
                event = make_event("rating", i, rng, tag="x")
                producer.send(topic, {**event, "event_id": event_id}, partition=i % 2)
    home = tmp_path / "home"
    home.mkdir()
    store = LocalEventStore(home / "store", home / "dead-letter")
    group = new_group_id("two")

    def start(delay: float, log: str) -> subprocess.Popen:
        return slow_ingest(delay, kafka_bootstrap, topic, home, group, log)

    def logs():
        return child_logs(home)

    a = start(0.15, "a.log")      # > 60 polls of <= 100 messages: 9 s at least
    b = None
    try:
        wait_for(lambda: a.pid in set().union(*writers(store).values() or [set()]),
                 "the first process to store a segment", 90, logs)
        b = start(0.0, "b.log")
        assert a.wait(timeout=240) == 0, logs()
        assert b.wait(timeout=240) == 0, logs()
    finally:
        for child in (a, b):
            if child is not None and child.poll() is None:
                child.kill()

    stored = Counter(store.read("rating", columns=["event_id"]).column("event_id").to_pylist())
    assert stored == Counter(produced), (
        f"missing {len(set(produced) - set(stored))}, "
        f"duplicated {sum(1 for c in stored.values() if c > 1)}")
    assert sum(store.next_offsets().values()) == _end(kafka_bootstrap, topic, 2)
    summaries = [json.loads(line) for name in ("a.log", "b.log")
                 for line in (home / name).read_text().splitlines() if line.startswith("{")]
    assert [s["stopped"] for s in summaries] == ["end offsets reached"] * 2, logs()
    assert sum(s["events"] for s in summaries) == len(produced)
    assert all(s["events"] > 0 for s in summaries), summaries
    assert {a.pid, b.pid} <= set().union(*writers(store).values())


def test_an_until_end_member_with_no_partition_waits_for_the_topic_to_be_stored(
        kafka_bootstrap, tmp_path):
    """Two ``until_end`` processes of one group on a 1-partition topic: after the rebalance one
    of them has no partition. It must not call the topic drained (an Airflow ingest task that
    did would let its retrain read a window without the events): each returns only once the
    store holds the topic to its end, which the member holding the partition, slowed down,
    reaches seconds later."""
    topic = new_topic(kafka_bootstrap, partitions=1, prefix="idle-until-end")
    rng = random.Random(8)
    with EventProducer(kafka_bootstrap, encoding="compact", batch_events=1) as producer:
        for i in range(3_000):
            producer.send(topic, make_event("rating", i, rng, tag="idle"))
    home = tmp_path / "home"
    home.mkdir()
    store = LocalEventStore(home / "store", home / "dead-letter")
    group = new_group_id("idle")

    def start(delay: float, log: str) -> subprocess.Popen:
        return slow_ingest(delay, kafka_bootstrap, topic, home, group, log)

    def logs():
        return child_logs(home)

    busy = start(0.3, "busy.log")     # 3,000 messages, <= 100 per poll: 9 s at least
    idle = None
    held_at_exit = {}                 # process -> events stored when it returned
    try:
        wait_for(lambda: store.next_offsets(), "the first process to store a segment", 90, logs)
        idle = start(0.0, "idle.log")
        deadline = time.monotonic() + 240
        while len(held_at_exit) < 2 and time.monotonic() < deadline:
            for name, child in (("busy", busy), ("idle", idle)):
                if name not in held_at_exit and child.poll() is not None:
                    assert child.returncode == 0, logs()
                    held_at_exit[name] = store.read("rating", columns=["event_id"]).num_rows
            time.sleep(0.05)
    finally:
        for child in (busy, idle):
            if child is not None and child.poll() is None:
                child.kill()
    # whichever member the rebalance left without the partition returned only once it was
    # stored to its end
    assert held_at_exit == {"busy": 3_000, "idle": 3_000}, (held_at_exit, logs())
