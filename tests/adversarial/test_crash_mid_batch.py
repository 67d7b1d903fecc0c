"""§1 of the adversarial review: a run that fails or is killed at any step of add, flush and
commit loses nothing and stores nothing twice. Before the fix, an exception while a poll batch
was being added left the buffer claiming the batch's whole offset span, and closing the
consumer revoked the partitions, which flushed that half-built buffer and committed it: the
batch's unadded events were gone for good, with a green rerun."""

from __future__ import annotations

import json
import random
import subprocess
import sys
from collections import Counter

import pytest

from pipeline.ingest.codec import encode_json
from pipeline.ingest.kafka import new_group_id
from pipeline.ingest.local_store import LocalEventStore
from pipeline.ingest.producer import EventProducer
from tests.ingest.factory import REPO, consume_all, new_topic

N_GOOD = 1500


def _produce(bootstrap: str, topic: str) -> tuple[list[str], list[str]]:
    """JSON messages, with every other run of 300 events sent as compact column batches of 50
    (the fast path of ingestion), and a malformed message every 50 events."""
    rng = random.Random(7)
    good, bad = [], []
    with EventProducer(bootstrap) as producer, \
            EventProducer(bootstrap, encoding="compact", batch_events=50) as compact:
        for i in range(N_GOOD):
            if i % 50 == 25:
                bad.append(f"bad-{i}")
                producer.send_raw(topic, f'{{"kind": "rating", "event_id": "bad-{i}", '.encode(),
                                  partition=i % 2)
            event = {"kind": "rating", "event_id": f"ev-{i}", "ts": 1_700_000_000_000 + i,
                     "user": f"u{rng.randrange(40)}", "item": f"i{rng.randrange(60)}",
                     "rating": rng.choice([1, 2, 3, 4, 5])}
            good.append(event["event_id"])
            if (i // 300) % 2:
                compact.send(topic, event, partition=i % 2)
            else:
                producer.send_raw(topic, encode_json(event), partition=i % 2)
            if i % 300 == 299:     # keep the runs in order on the topic
                compact.flush()
                producer.flush()
    return good, bad


def _ingest(step, mode, nth, bootstrap, topic, home, group) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "tests.adversarial.faulty_ingest", step, mode,
                           str(nth), bootstrap, topic, str(home), group], cwd=REPO,
                          capture_output=True, text=True, timeout=180)


@pytest.mark.parametrize("step,nth", [("add", 3), ("decode", 400), ("dead_letters", 2),
                                      ("write", 3), ("written", 3), ("commit", 3)])
@pytest.mark.parametrize("mode", ["raise", "kill"])
def test_a_failed_or_killed_run_and_its_rerun_store_every_event_once(
        kafka_bootstrap, tmp_path, step, nth, mode):
    topic = new_topic(kafka_bootstrap, partitions=2, prefix=f"fault-{step}-{mode}")
    good, bad = _produce(kafka_bootstrap, topic)
    home, group = tmp_path / "home", new_group_id("fault")
    first = _ingest(step, mode, nth, kafka_bootstrap, topic, home, group)
    survives = step == "decode" and mode == "raise"
    if not survives:
        assert first.returncode != 0, f"the fault in {step} did not fire:\n{first.stdout}"
    # the failed run committed no offset past what it stored durably
    stored_first = LocalEventStore(home / "store", home / "dead-letter").next_offsets()
    for p, offset in _committed(kafka_bootstrap, group, topic).items():
        assert offset <= stored_first.get((topic, p), 0), (
            f"partition {p}: committed {offset}, stored up to {stored_first.get((topic, p), 0)}")
    rerun = _ingest("none", "-", 0, kafka_bootstrap, topic, home, group)
    assert rerun.returncode == 0, rerun.stderr[-3000:]

    store = LocalEventStore(home / "store", home / "dead-letter")
    stored = Counter(store.read("rating", columns=["event_id"]).column("event_id").to_pylist())
    assert stored == Counter(good), (f"missing {len(set(good) - set(stored))}, "
                                     f"duplicated {sum(c > 1 for c in stored.values())}")
    # every bad message of the topic is a dead letter exactly once, at its own offset
    records = consume_all(kafka_bootstrap, topic)
    bad_at = Counter((r.partition, r.offset) for r in records if b'"bad-' in r.value)
    dead = store.read_dead_letters()
    assert Counter(zip(dead.column("partition").to_pylist(),
                       dead.column("offset").to_pylist())) == bad_at
    assert len(bad_at) == len(bad)
    assert store.segments(complete=False) == []
    if survives:  # a batch that fails to decode is retried message by message; the run goes on
        assert first.returncode == 0, first.stderr[-3000:]
    # the store and the committed offsets (monitoring) both end at the topic's end
    ends = {(r.partition): r.offset + 1 for r in records}
    assert json.loads(json.dumps(store.stats()["next_offsets"])) == {
        f"{topic}/{p}": o for p, o in sorted(ends.items())}
    assert _committed(kafka_bootstrap, group, topic) == ends


def _committed(bootstrap: str, group: str, topic: str) -> dict[int, int]:
    """The group's committed offsets of ``topic``, per partition (none: not in the dict)."""
    from kafka import KafkaAdminClient

    admin = KafkaAdminClient(bootstrap_servers=bootstrap)
    try:
        offsets = admin.list_group_offsets({group: None}).get(group, {})
    finally:
        admin.close()
    return {tp.partition: meta.offset for tp, meta in offsets.items()
            if tp.topic == topic and meta.offset >= 0}
