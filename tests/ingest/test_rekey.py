"""The re-keying stage through a real broker (issue 53): events another producer spread over a
4-partition topic without keys (JSON events, an array, a compact batch of many users) come out
of ``Rekeyer`` in a topic created like the source, each user's events in the partition of their
id and in the order read, every event exactly once; what has no user or does not decode goes on
as it came, for its reader's dead letters; a second run reads nothing again (offsets were
committed after the flush)."""

from __future__ import annotations

import json
import subprocess
import sys
import uuid
from collections import defaultdict

import msgpack

from pipeline.ingest.codec import (
    DecodeError,
    batch_columns,
    batch_row,
    decode,
    encode_batch,
    is_batch,
)
from pipeline.ingest.producer import EventProducer
from pipeline.ingest.rekey import Rekeyer, target_of
from pipeline.settings import Settings
from tests.ingest.factory import consume_all, new_topic

T0 = 1_700_000_000_000
PARTITIONS = 4


def _event(n: int) -> dict:
    return {"kind": "interaction", "event_id": f"e{n}", "ts": T0 + n, "user": f"u{n % 23}",
            "item": f"i{n % 11}"}


def _read(bootstrap: str, topic: str) -> tuple[list, list, int]:
    """``([(partition, event)] in each partition's order, [raw values that do not decode or
    have no user], partition count)`` of everything in ``topic``."""
    from kafka import KafkaConsumer

    events, raw = [], []
    for m in consume_all(bootstrap, topic):
        try:
            obj, _ = decode(m.value)
        except DecodeError:
            raw.append(m.value)
            continue
        rows = [obj] if not is_batch(obj) else [
            {**batch_row(cols, i), "kind": obj["kind"]}
            for cols, n in [batch_columns(obj)] for i in range(n)]
        for row in rows:
            if isinstance(row, dict) and "user" in row:
                events.append((m.partition, row))
            else:
                raw.append(m.value)
    reader = KafkaConsumer(bootstrap_servers=bootstrap)
    try:
        return events, raw, len(reader.partitions_for_topic(topic))
    finally:
        reader.close()


def test_events_of_unkeyed_producers_come_out_keyed_by_user_each_once(kafka_bootstrap,
                                                                      tmp_path):
    source = new_topic(kafka_bootstrap, partitions=PARTITIONS, prefix="rekey-src")
    with EventProducer(kafka_bootstrap) as producer:     # another producer: no keys at all
        for n in range(300):
            producer.send_raw(source, json.dumps(_event(n)).encode(), partition=n % PARTITIONS)
        producer.send_raw(source, json.dumps([_event(n) for n in range(300, 310)]).encode(),
                          partition=1)
        batch = [{k: v for k, v in _event(n).items() if k != "kind"} for n in range(310, 350)]
        producer.send_raw(source, encode_batch("interaction", batch), partition=2)
        producer.send_raw(source, b"not json {", partition=3)
        producer.send_raw(source, msgpack.packb({"kind": "interaction", "event_id": "nouser",
                                                 "ts": T0, "item": "i1"}), partition=0)
    settings = Settings(home=tmp_path, kafka_bootstrap=kafka_bootstrap)
    target, group = target_of(source), f"rekey-test-{uuid.uuid4().hex[:8]}"
    counts = Rekeyer(source, target, settings, group=group).run(until_idle=3.0)
    assert counts == {"messages": 304, "events": 350, "passed_on": 2}

    events, raw, partitions = _read(kafka_bootstrap, target)
    assert partitions == PARTITIONS          # created like the source, not by the broker
    ids = [e["event_id"] for _, e in events]
    assert sorted(ids) == sorted(f"e{n}" for n in range(350)), "each event exactly once"
    assert all(e == _event(int(e["event_id"][1:])) for _, e in events)   # field for field
    where = defaultdict(set)
    with EventProducer(kafka_bootstrap) as producer:
        for partition, e in events:
            where[e["user"]].add(partition)
            assert partition == producer.partition_of(target, e["user"].encode())
    assert all(len(p) == 1 for p in where.values()) and len(where) == 23
    assert len({p for ps in where.values() for p in ps}) > 1    # users spread over partitions
    assert b"not json {" in raw and len(raw) == 2       # both go on, for their dead letters
    # a user's events keep the order read from one source partition
    per_user = defaultdict(list)
    for _, e in events:
        if int(e["event_id"][1:]) < 300:
            per_user[e["user"]].append(int(e["event_id"][1:]))
    for user, ns in per_user.items():
        for part in range(PARTITIONS):
            mine = [n for n in ns if n % PARTITIONS == part]
            assert mine == sorted(mine), user

    again = Rekeyer(source, target, settings, group=group).run(until_idle=2.0)
    assert again == {"messages": 0, "events": 0, "passed_on": 0}, "committed after the flush"
    assert len(_read(kafka_bootstrap, target)[0]) == 350


def test_the_command_names_a_missing_source_in_one_line(kafka_bootstrap, tmp_path):
    missing = f"rekey-missing-{uuid.uuid4().hex[:8]}"
    done = subprocess.run([sys.executable, "-m", "pipeline.cli", "rekey", missing,
                           "--bootstrap", kafka_bootstrap, "--home", str(tmp_path),
                           "--until-idle", "1"], capture_output=True, text=True, timeout=120)
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == [
        f"rankstream rekey: topic {missing!r} does not exist on {kafka_bootstrap}: nothing to "
        "re-key"]
    from kafka.admin import KafkaAdminClient

    admin = KafkaAdminClient(bootstrap_servers=kafka_bootstrap)
    try:
        assert missing not in admin.list_topics() and target_of(missing) not in \
            admin.list_topics(), "neither topic was made"
    finally:
        admin.close()
