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
    store = EventStore(home / "store", home / "dead-letter")
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
    store = EventStore(home / "store", home / "dead-letter")
    group = new_group_id("two")

    def start(delay: float, log: str) -> subprocess.Popen:
        with open(home / log, "wb") as out:
            return subprocess.Popen(
                [sys.executable, "-m", "tests.ingest.slow_ingest", str(delay), kafka_bootstrap,
                 topic, str(home), group], cwd=REPO, stdout=out, stderr=subprocess.STDOUT)

    def logs():
        return "\n".join(p.read_text()[-2000:] for p in home.glob("*.log"))

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
