"""Events of every kind, valid and malformed, for the ingestion tests."""

from __future__ import annotations

import json
import random
import subprocess
import sys
import uuid
from pathlib import Path

import msgpack

from pipeline.ingest.codec import encode_json
from pipeline.settings import Settings

TS = 1_700_000_000_000    # a valid event time (2023-11-14)

REPO = Path(__file__).resolve().parents[2]
UNICODE_NAMES = ["Zoë", "用户", "Ελένη", "🙂emoji", "ñandú", "Ærø"]


def _id(rng: random.Random, prefix: str, n: int, unicode: bool):
    if rng.random() < 0.3:
        return rng.randrange(n)                      # integer ids are stored as strings
    name = rng.choice(UNICODE_NAMES) if unicode else prefix
    return f"{name}-{rng.randrange(n)}"


def _features(rng: random.Random, sparse: bool):
    if sparse:
        keys = rng.sample(range(5000), rng.randrange(1, 8))
        return {str(k): round(rng.uniform(-3, 3), 6) for k in keys}
    return [round(rng.uniform(-3, 3), 6) for _ in range(8)]


def make_event(kind: str, i: int, rng: random.Random, unicode: bool = True,
               tag: str = "ev") -> dict:
    """A valid event of ``kind`` with event id ``{tag}-{i}``."""
    ts = 1_700_000_000_000 + i * 1000
    event = {"kind": kind, "event_id": f"{tag}-{i}",
             "ts": ts if rng.random() < 0.8 else "2023-11-14T22:13:20.500+00:00"}
    sparse = rng.random() < 0.5
    if kind == "rating":
        event.update(user=_id(rng, "u", 50, unicode), item=_id(rng, "i", 80, unicode),
                     rating=rng.choice([1, 2, 3, 4, 5, 3.5]))
    elif kind == "comparison":
        winner, loser = rng.sample(range(100), 2)
        event.update(user=_id(rng, "u", 50, unicode), winner=f"i{winner}", loser=loser)
    elif kind == "interaction":
        event.update(user=_id(rng, "u", 50, unicode), item=_id(rng, "i", 80, unicode))
        if rng.random() < 0.5:
            event["action"] = rng.choice(["view", "click", "purchase"])
    elif kind == "judgment":
        event.update(query=_id(rng, "q", 20, unicode), doc=_id(rng, "d", 200, unicode),
                     label=rng.randrange(3), features=_features(rng, sparse))
    elif kind == "outcome":
        event.update(item=_id(rng, "i", 80, unicode), label=rng.randrange(2),
                     features=_features(rng, sparse))
    else:
        event.update(item=_id(rng, "i", 80, unicode), label=rng.randrange(1, 6))
        if rng.random() < 0.7:
            event["features"] = _features(rng, sparse)
        if rng.random() < 0.5 or "features" not in event:
            event["text"] = rng.choice(["gut", "très bien", "最高", "meh"])
    return event


def malformed(i: int, rng: random.Random, max_bytes: int) -> tuple[bytes, str]:
    """A malformed message with marker ``bad-{i}`` in its bytes, and the (start of the)
    reason the consumer must give. Cycles through every kind of problem."""
    marker = f"bad-{i}"
    good = make_event(rng.choice(["rating", "comparison", "judgment", "outcome", "ordinal"]),
                      i, rng, tag="bad")
    cases = [
        lambda: (f'{{"kind": "rating", "event_id": "{marker}", '.encode(), "bad JSON: "),
        lambda: (f'{{"kind": "rating", "event_id": "{marker}", "user": "'.encode()
                 + b"\xff\xfe\"}", "bad UTF-8 at byte "),
        lambda: (encode_json({**good, "text": "x" * max_bytes}), "message is "),
        lambda: (encode_json({**good, "kind": "click"}), "unknown kind 'click'"),
        lambda: (encode_json({k: v for k, v in good.items() if k != "kind"}),
                 "missing field 'kind'"),
        lambda: (json.dumps([marker]).encode(), f"event is '{marker}', expected an object"),
        lambda: (msgpack.packb({"event_id": marker})[:-2], "bad msgpack: "),
        lambda: (encode_json({"kind": "rating", "event_id": marker, "ts": TS + 5, "user": "u",
                              "item": "i", "rating": "five"}),
                 "rating: field 'rating' is 'five', expected a number"),
        lambda: (encode_json({"kind": "comparison", "event_id": marker, "ts": TS + 5, "user": "u",
                              "winner": "i42", "loser": "i42"}),
                 "comparison: winner == loser == 'i42'"),
        lambda: (encode_json({"kind": "judgment", "event_id": marker, "ts": TS + 5, "query": "q",
                              "doc": "d", "label": 1, "features": {"-3": 1.0}}),
                 "judgment: features: index -3 < 0"),
        lambda: (encode_json({"kind": "outcome", "event_id": marker, "ts": TS + 5, "item": "i",
                              "label": 2, "features": [1.0]}),
                 "outcome: field 'label' is 2, expected 0 or 1"),
        lambda: (encode_json({"kind": "ordinal", "event_id": marker, "ts": TS + 5, "item": "i",
                              "label": 0, "text": "x"}),
                 "ordinal: field 'label' is 0, expected an integer >= 1"),
        lambda: (encode_json({**good, "event_id": marker, "ts": "yesterday"}),
                 f"{good['kind']}: field 'ts' is 'yesterday', not an ISO-8601 time"),
        lambda: (encode_json({"kind": "judgment", "event_id": marker, "ts": TS + 5, "query": "q",
                              "doc": "d", "label": 1, "features": [1.0, "x"]}),
                 "judgment: features: value at position 1 is 'x', expected a number"),
        lambda: (json.dumps(marker).encode(), f"message is '{marker}', expected an event"),
        lambda: (msgpack.packb({"batch": 1, "kind": "rating", "n": 2,
                                "columns": {"event_id": [marker]}}), "batch: column 'event_id'"),
    ]
    return cases[i % len(cases)]()


def new_topic(bootstrap: str, partitions: int = 1, prefix: str = "t") -> str:
    """Create a topic with a unique name (the broker is shared by the whole test session)."""
    from kafka.admin import KafkaAdminClient, NewTopic

    topic = f"{prefix}-{uuid.uuid4().hex[:10]}"
    admin = KafkaAdminClient(bootstrap_servers=bootstrap)
    try:
        admin.create_topics([NewTopic(topic, partitions, 1)])
    finally:
        admin.close()
    return topic


def settings_for(home: Path, bootstrap: str | None = None, dead_letter_topic: str | None = None
                 ) -> Settings:
    return Settings(home=home, kafka_bootstrap=bootstrap,
                    dead_letter_topic=dead_letter_topic or f"dlq-{uuid.uuid4().hex[:10]}")


def cli_ingest(home: Path, bootstrap: str, topic: str, *extra: str,
               log: str = "child.log") -> subprocess.Popen:
    """``rankstream ingest`` in a child process (stdout and stderr appended to ``home/log``)."""
    home.mkdir(parents=True, exist_ok=True)
    out = open(home / log, "ab")
    cmd = [sys.executable, "-m", "pipeline.cli", "ingest", "--topic", topic, "--home", str(home),
           "--bootstrap", bootstrap, "--no-progress", *extra]
    try:
        return subprocess.Popen(cmd, cwd=REPO, stdout=out, stderr=subprocess.STDOUT)
    finally:
        out.close()


def consume_all(bootstrap: str, topic: str, timeout_s: float = 20.0) -> list:
    """Every record of a topic, from the beginning to its current end."""
    from kafka import KafkaConsumer, TopicPartition

    consumer = KafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False)
    try:
        parts = [TopicPartition(topic, p) for p in sorted(consumer.partitions_for_topic(topic)
                                                          or ())]
        consumer.assign(parts)
        consumer.seek_to_beginning(*parts)
        ends = consumer.end_offsets(parts)
        records = []
        import time
        deadline = time.monotonic() + timeout_s
        while any(consumer.position(tp) < ends[tp] for tp in parts):
            if time.monotonic() > deadline:
                raise TimeoutError(f"could not read {topic} to its end")
            for batch in consumer.poll(timeout_ms=500).values():
                records.extend(batch)
        return records
    finally:
        consumer.close()
