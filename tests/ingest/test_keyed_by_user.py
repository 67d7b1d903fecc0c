"""Events are keyed by user where rankstream produces them (issue 53), through a real broker:
every user's events land in one partition of a 4-partition topic, the same one whether they
went as JSON, msgpack or compact batches or from a JSON lines file, and that partition is what
Kafka's default partitioner gives the user's id (what a Java producer keyed by user would
pick). So refreshers in one group split users, not events."""

from __future__ import annotations

import json
from collections import defaultdict

import pytest

from pipeline.ingest.codec import DecodeError, batch_columns, batch_row, decode, is_batch
from pipeline.ingest.producer import EventProducer, produce_files
from tests.ingest.factory import new_topic

T0 = 1_700_000_000_000


def _events(prefix: str, n: int = 240) -> list[dict]:
    # ids as ints and as strings: 7 and "7" are one user to ingest, hence one key
    return [{"kind": "rating", "event_id": f"{prefix}{i}", "ts": T0 + i,
             "user": (i % 30) if i % 2 else str(i % 30), "item": f"i{i % 17}", "rating": 4.0}
            for i in range(n)]


def _users_by_partition(bootstrap: str, topic: str) -> dict:
    """{user id as text: {partition, ...}} of every event in ``topic``; messages that do not
    decode under the key ``None``."""
    from kafka import KafkaConsumer, TopicPartition

    consumer = KafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False)
    try:
        parts = [TopicPartition(topic, p) for p in sorted(consumer.partitions_for_topic(topic))]
        consumer.assign(parts)
        consumer.seek_to_beginning(*parts)
        ends = consumer.end_offsets(parts)
        seen = defaultdict(set)
        while any(consumer.position(tp) < ends[tp] for tp in parts):
            for tp, messages in consumer.poll(timeout_ms=1000).items():
                for m in messages:
                    try:
                        obj, _ = decode(m.value)
                    except DecodeError:
                        seen[None].add(tp.partition)
                        continue
                    rows = [obj] if not is_batch(obj) else [
                        batch_row(cols, i) for cols, n in [batch_columns(obj)]
                        for i in range(n)]
                    for row in rows:
                        seen[str(row["user"])].add(tp.partition)
        return seen
    finally:
        consumer.close()


@pytest.mark.parametrize("encoding", ["json", "msgpack", "compact"])
def test_each_users_events_go_to_the_partition_of_their_id(kafka_bootstrap, encoding):
    topic = new_topic(kafka_bootstrap, partitions=4, prefix=f"keyed-{encoding}")
    with EventProducer(kafka_bootstrap, encoding=encoding, batch_events=16) as producer:
        producer.send_many(topic, _events("a"))
        expected = {str(u): producer.partition_of(topic, str(u).encode()) for u in range(30)}
    seen = _users_by_partition(kafka_bootstrap, topic)
    assert set(seen) == set(expected)
    assert {u: sorted(p) for u, p in seen.items()} == {u: [p] for u, p in expected.items()}
    assert len(set(expected.values())) > 1          # the users are spread over partitions


def test_a_files_lines_are_keyed_like_the_events_sent_one_by_one(kafka_bootstrap, tmp_path):
    topic = new_topic(kafka_bootstrap, partitions=4, prefix="keyed-file")
    lines = tmp_path / "a.jsonl"
    lines.write_text("".join(json.dumps(e) + "\n" for e in _events("f")) + "not json\n")
    produce_files([lines], topic, bootstrap=kafka_bootstrap, progress=False)
    with EventProducer(kafka_bootstrap, encoding="compact") as producer:
        producer.send_many(topic, _events("g"))
    seen = _users_by_partition(kafka_bootstrap, topic)
    assert len(seen.pop(None)) == 1     # the bad line went as it is, for a dead letter later
    assert len(seen) == 30 and all(len(p) == 1 for p in seen.values()), seen
