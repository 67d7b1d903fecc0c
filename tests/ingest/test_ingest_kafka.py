"""Kafka -> store through the real broker: round trip of every kind and encoding, poison
messages of every type, offsets committed for monitoring, follow mode with SIGTERM."""

from __future__ import annotations

import random
import re
import signal
import time

import pytest

from pipeline.ingest.codec import decode
from pipeline.ingest.events import KIND_NAMES
from pipeline.ingest.kafka import ingest_kafka, new_group_id
from pipeline.ingest.local_store import LocalEventStore
from pipeline.ingest.open_store import open_store
from pipeline.ingest.producer import EventProducer
from pipeline.ingest.store import EventStore
from pipeline.ingest.validate import check_event, normalize_event
from tests.ingest.factory import (
    cli_ingest,
    consume_all,
    make_event,
    malformed,
    new_topic,
    settings_for,
)

MAX_BYTES = 4096


def stored_events(store: EventStore) -> dict[str, dict]:
    """Every stored event by event id (asserting that none is stored twice)."""
    out = {}
    for kind in KIND_NAMES:
        for row in store.read(kind).to_pylist():
            assert row["event_id"] not in out, f"{row['event_id']} stored twice"
            out[row["event_id"]] = {"kind": kind, **row}
    return out


@pytest.mark.parametrize("encoding", ["json", "msgpack", "compact"])
def test_round_trip_of_every_kind(kafka_bootstrap, tmp_path, encoding):
    rng = random.Random(11)
    topic = new_topic(kafka_bootstrap, partitions=2, prefix=f"roundtrip-{encoding}")
    events = [make_event(kind, i, rng) for i in range(40) for kind in KIND_NAMES]
    rng.shuffle(events)
    for i, e in enumerate(events):
        e["event_id"] = f"ïd-{i}-{e['kind']}"
    with EventProducer(kafka_bootstrap, encoding=encoding, batch_events=25) as producer:
        producer.send_many(topic, events)
    settings = settings_for(tmp_path, kafka_bootstrap)
    group = new_group_id("roundtrip")
    summary = ingest_kafka([topic], settings=settings, group_id=group, until_end=True,
                           progress=False)
    assert summary.stopped == "end offsets reached"
    assert sum(summary.events.values()) == len(events) and not summary.dead_letters

    stored = stored_events(open_store(settings))
    assert set(stored) == {e["event_id"] for e in events}
    for event in events:
        row = stored[event["event_id"]]
        row.pop("offset")
        assert row == normalize_event(event), event

    # offsets were committed after the segments (for lag monitoring); a partition the
    # producer's partitioner happened to send nothing to has nothing to commit (None: lag 0)
    from kafka import KafkaConsumer, TopicPartition

    probe = KafkaConsumer(bootstrap_servers=kafka_bootstrap, group_id=group,
                          enable_auto_commit=False)
    parts = [TopicPartition(topic, p) for p in (0, 1)]
    ends = probe.end_offsets(parts)
    assert {tp: probe.committed(tp) or 0 for tp in parts} == ends
    probe.close()


def test_poison_messages_of_every_type_go_to_dead_letters(kafka_bootstrap, tmp_path):
    """~1% malformed messages of every type, and 1% bad events inside compact batches: every
    valid event lands in the store, every bad one in both dead letters, with its reason."""
    rng = random.Random(12)
    topic = new_topic(kafka_bootstrap, partitions=2, prefix="poison")
    settings = settings_for(tmp_path, kafka_bootstrap)
    valid, expected_reasons = [], {}
    with EventProducer(kafka_bootstrap, encoding="json") as producer:
        for i in range(3200):
            if i % 100 == 7:                                  # 32 malformed messages
                raw, reason = malformed(i, rng, MAX_BYTES)
                producer.send_raw(topic, raw)
                expected_reasons[f"bad-{i}"] = reason
            else:
                event = make_event(rng.choice(KIND_NAMES), i, rng)
                producer.send(topic, event)
                valid.append(event["event_id"])
    with EventProducer(kafka_bootstrap, encoding="compact", batch_events=100,
                       max_message_bytes=MAX_BYTES) as producer:
        for i in range(4000, 6000):
            event = make_event(rng.choice(KIND_NAMES), i, rng)
            if i % 100 == 50:                                 # 1% bad events inside batches
                event["event_id"] = f"bad-{i}"
                event["ts"] = "yesterday" if i % 200 else -5
                expected_reasons[event["event_id"]] = check_event(event)
            else:
                valid.append(event["event_id"])
            producer.send(topic, event)

    summary = ingest_kafka([topic], settings=settings, group_id=new_group_id("poison"),
                           until_end=True, progress=False, max_message_bytes=MAX_BYTES,
                           flush_events=1000)
    assert summary.stopped == "end offsets reached"
    assert sum(summary.dead_letters.values()) == len(expected_reasons)

    store = open_store(settings)
    assert sorted(stored_events(store)) == sorted(valid)
    dead = store.read_dead_letters().to_pylist()
    found = {}
    for letter in dead:
        marker = re.search(rb"bad-\d+", letter["raw"]).group().decode()
        assert marker not in found, f"{marker} dead-lettered twice"
        found[marker] = letter["reason"]
        assert letter["topic"] == topic and letter["offset"] >= 0
    assert set(found) == set(expected_reasons)
    for marker, reason in expected_reasons.items():
        assert found[marker].startswith(reason), (marker, found[marker], reason)

    published = consume_all(kafka_bootstrap, settings.dead_letter_topic)
    assert len(published) == len(expected_reasons)
    headers = dict(published[0].headers)
    assert headers["rankstream.topic"].decode() == topic and "rankstream.reason" in headers
    in_batch = [letter for letter in dead if letter["index"] >= 0 and letter["kind"]]
    assert len(in_batch) == 20
    for letter in in_batch:            # the event re-encoded alone; the reason names its kind
        assert decode(letter["raw"])[0]["event_id"].startswith("bad-")
        assert letter["reason"].startswith(f"{letter['kind']}: field 'ts'")


def test_follow_mode_stops_cleanly_on_sigterm(kafka_bootstrap, tmp_path):
    rng = random.Random(13)
    topic = new_topic(kafka_bootstrap, partitions=1, prefix="follow")
    home = tmp_path / "home"
    child = cli_ingest(home, kafka_bootstrap, topic, "--flush-interval", "0.2",
                       "--dead-letter-topic", f"dlq-{topic}", "--group", new_group_id())
    try:
        with EventProducer(kafka_bootstrap) as producer:
            producer.send_many(topic, [make_event("rating", i, rng) for i in range(500)])
        store = LocalEventStore(home / "store", home / "dead-letter")
        deadline = time.monotonic() + 60
        while store.next_offset(topic, 0) != 500:
            assert time.monotonic() < deadline, (home / "child.log").read_text()
            assert child.poll() is None, (home / "child.log").read_text()
            time.sleep(0.2)
        child.send_signal(signal.SIGTERM)
        assert child.wait(timeout=30) == 0
    finally:
        if child.poll() is None:
            child.kill()
    log = (home / "child.log").read_text()
    assert "ingested 500 events" in log and "stopped: stop requested" in log
