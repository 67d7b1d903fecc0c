"""§2 of the adversarial review: poison that made every rerun crash on the same offset, so the
topic never advanced. Each message here sits between good events on a real topic; ingestion
must finish, store the good events once, and keep the poison as a dead letter with a reason
(in the local dead-letter files, whole, and on the dead-letter topic, truncated when large)."""

from __future__ import annotations

import json

import msgpack
import pytest

from pipeline.ingest.codec import encode_json
from pipeline.ingest.dead_letters import DeadLetterTopicError
from pipeline.ingest.files import ingest_files
from pipeline.ingest.kafka import ingest_kafka, new_group_id
from pipeline.ingest.open_store import open_store
from pipeline.ingest.producer import EventProducer
from pipeline.ingest.store import EventStore
from pipeline.settings import Settings
from tests.ingest.factory import consume_all, new_topic, settings_for

TS = 1_700_000_000_000    # a valid event time (2023-11-14)


def _event(i: int, **extra) -> dict:
    return {"kind": "rating", "event_id": f"ev-{i}", "ts": TS + i,
            "user": f"u{i % 7}", "item": f"i{i % 11}", "rating": 1 + i % 5, **extra}


DEEP = 5000
POISON = {
    "tombstone": None,
    "integer of 5000 digits": b'{"kind": "rating", "event_id": "p", "ts": 1700000000001, '
                              b'"user": "u", "item": "i", "rating": ' + b"7" * 5000 + b"}",
    "kind is a list": encode_json(_event(-1, kind=["rating"])),
    "kind is a map": encode_json(_event(-2, kind={"rating": 1})),
    "invalid message of 1.1 MiB": b'{"kind": "rating", "text": "' + b"x" * (1_150_000),
    "JSON nested 5000 deep": b"[" * DEEP + b"]" * DEEP,
    # parses (just under Python's recursion limit), then re-encoding the event for its dead
    # letter recursed too deeply
    "a field nested 990 deep in an array": (
        b'[{"kind": "rating", "event_id": "d", "ts": 1700000000001, "item": "i", "rating": 1, '
        b'"user": '
        + b"[" * 990 + b"]" * 990 + b"}]"),
    "msgpack nested 5000 deep": b"\x91" * DEEP + b"\x90",
    "id with a NUL": encode_json(_event(-3, user="u\x00")),
    "feature index 2^31-1": encode_json({"kind": "outcome", "event_id": "f", "ts": TS + 1,
                                         "item": "i", "label": 1,
                                         "features": {str(2**31 - 1): 1.0}}),
    "feature index of 40 digits": encode_json({"kind": "outcome", "event_id": "g", "ts": TS + 1,
                                               "item": "i", "label": 1,
                                               "features": {"9" * 40: 1.0}}),
    "msgpack batch with a huge int": msgpack.packb({"batch": 1, "kind": "rating", "n": 1,
                                                    "columns": {"event_id": ["b"],
                                                                "ts": [2**64 - 1], "user": ["u"],
                                                                "item": ["i"],
                                                                "rating": [2**64 - 1]}}),
}


def _produce(bootstrap: str, topic: str, poison: bytes | None, n_good: int = 40) -> list[str]:
    good = []
    with EventProducer(bootstrap) as producer:
        for i in range(n_good):
            if i == n_good // 2:
                producer.producer.send(topic, key=b"k", value=poison)  # None: a tombstone
                producer.messages += 1
            good.append(f"ev-{i}")
            producer.send(topic, _event(i))
    return good


def _stored(store: EventStore) -> list[str]:
    return sorted(store.read("rating", columns=["event_id"]).column("event_id").to_pylist())


@pytest.mark.parametrize("name", sorted(POISON))
def test_poison_message_becomes_a_dead_letter(kafka_bootstrap, tmp_path, name):
    topic = new_topic(kafka_bootstrap, prefix="poison")
    good = _produce(kafka_bootstrap, topic, POISON[name])
    settings = settings_for(tmp_path, kafka_bootstrap)
    group = new_group_id("poison")
    for _ in range(2):   # the second run finds nothing new: no crash loop either way
        summary = ingest_kafka([topic], settings=settings, group_id=group, until_end=True,
                               progress=False)
        assert summary.stopped == "end offsets reached"
    store = open_store(settings)
    assert _stored(store) == sorted(good)
    dead = store.read_dead_letters().to_pylist()
    assert len(dead) == 1 and dead[0]["offset"] == 20 and dead[0]["reason"]
    if name.startswith("msgpack batch"):                # one event of a batch: itself
        assert dead[0]["index"] == 0 and msgpack.unpackb(dead[0]["raw"])["event_id"] == "b"
    else:
        assert dead[0]["raw"] == (POISON[name] or b"")  # the whole payload, kept locally
    on_topic = consume_all(kafka_bootstrap, settings.dead_letter_topic)
    assert len(on_topic) == 1
    headers = dict(on_topic[0].headers)
    assert headers["rankstream.reason"].decode() == dead[0]["reason"]
    if len(POISON[name] or b"") > 256 << 10:            # too large for the topic: truncated
        assert len(on_topic[0].value) == 256 << 10
        assert headers["rankstream.size"] == str(len(POISON[name])).encode()
        assert headers["rankstream.truncated"] == b"1"


def test_reasons_say_what_is_wrong(tmp_path):
    """The same poison through a file source: one dead letter each, with a readable reason."""
    from pipeline.ingest.buffer import PartitionBuffer

    buf = PartitionBuffer("t", 0, default_kind="rating")
    names = sorted(POISON)
    buf.add_messages([POISON[n] for n in names], list(range(len(names))))
    reasons = {names[offset]: reason for offset, reason in zip(buf.dead.offsets, buf.dead.reasons)}
    assert len(buf.dead) == len(names) and buf.events == 0
    assert reasons["tombstone"].startswith("message is a tombstone")
    assert "4300" in reasons["integer of 5000 digits"]
    assert reasons["kind is a list"] == "field 'kind' is a list, expected a string"
    assert "nested too deeply" in reasons["JSON nested 5000 deep"]
    assert "over the limit of 1048576" in reasons["invalid message of 1.1 MiB"]
    assert "control character U+0000" in reasons["id with a NUL"]
    assert "index 2147483647 > 16777215, the limit" in reasons["feature index 2^31-1"]


def test_an_unwritable_dead_letter_topic_stops_ingest_before_committing(kafka_bootstrap,
                                                                        tmp_path):
    """A dead-letter topic that refuses records (here: max.message.bytes of 64) stops ingestion
    with an error naming it and how to fix it; nothing of those offsets is stored or committed,
    and once the topic accepts them a rerun stores everything exactly once."""
    from kafka.admin import ConfigResource, ConfigResourceType, KafkaAdminClient, NewTopic

    topic = new_topic(kafka_bootstrap, prefix="dlqfull")
    dlq = f"dlq-{topic}"
    admin = KafkaAdminClient(bootstrap_servers=kafka_bootstrap)
    admin.create_topics([NewTopic(dlq, 1, 1, topic_configs={"max.message.bytes": "64"})])
    good = _produce(kafka_bootstrap, topic, b'{"kind": "rating", "event_id": "bad" ' + b"x" * 200)
    settings = settings_for(tmp_path, kafka_bootstrap, dead_letter_topic=dlq)
    group = new_group_id("dlqfull")
    with pytest.raises(DeadLetterTopicError, match=f"dead-letter topic '{dlq}' refused") as err:
        ingest_kafka([topic], settings=settings, group_id=group, until_end=True,
                     flush_events=100_000, progress=False)
    for fix in ("max.message.bytes", "RANKSTREAM_DEAD_LETTER_TOPIC"):
        assert fix in str(err.value)
    store = open_store(settings)
    assert _stored(store) == [] and store.next_offsets() == {}
    assert admin.list_group_offsets({group: None}).get(group, {}) == {}, "committed offsets"
    admin.alter_configs([ConfigResource(ConfigResourceType.TOPIC, dlq,
                                        configs={"max.message.bytes": "1048576"})])
    admin.close()
    ingest_kafka([topic], settings=settings, group_id=group, until_end=True, progress=False)
    assert _stored(store) == sorted(good)
    assert len(store.read_dead_letters()) == 1


def test_one_bad_line_of_a_file_is_one_dead_letter(tmp_path):
    """A bad JSONL line (invalid UTF-8, broken JSON, a NUL in an id) and a CSV cell over
    128 KiB are one dead letter each, not a failed file."""
    settings = Settings(home=tmp_path / "home")
    jsonl = tmp_path / "events.jsonl"
    lines = [json.dumps(_event(i)).encode() for i in range(6)]
    lines[1] = b'{"kind": "rating", "event_id": "\xff\xfe"}'
    lines[3] = b'{"kind": "rating", "event_id": '
    lines[4] = json.dumps(_event(4, user="a\u0000b")).encode()
    jsonl.write_bytes(b"\n".join(lines) + b"\n")
    csv = tmp_path / "events.csv"
    rows = ["event_id,ts,user,item,rating"]
    rows += [f"c{i},{1_700_000_000_000 + i},u{i},i{i},{1 + i % 5}" for i in range(5)]
    rows[3] = f"c2,1700000000002,{'u' * 200_000},i2,3"
    csv.write_text("\n".join(rows) + "\n")
    summary = ingest_files([jsonl, csv], kind="rating", settings=settings, progress=False)
    assert summary.events["rating"] == 3 + 4
    assert sum(summary.dead_letters.values()) == 3 + 1
    reasons = open_store(settings).read_dead_letters().column("reason").to_pylist()
    assert any("field larger than field limit" in r for r in reasons)
