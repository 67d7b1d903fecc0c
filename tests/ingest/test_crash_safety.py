"""Crash safety: a child ``rankstream ingest`` is SIGKILLed at random moments while 200k events
(1/200 of them malformed) are being produced, restarted each time, and finally drained with
``--until-end``. The store must then hold every valid event exactly once, and the local
dead-letter directory every bad one exactly once."""

from __future__ import annotations

import os
import random
import re
import signal
import threading
import time
from collections import Counter

import pytest

from pipeline.ingest.events import KIND_NAMES
from pipeline.ingest.kafka import new_group_id
from pipeline.ingest.local_store import LocalEventStore
from pipeline.ingest.producer import EventProducer
from tests.ingest.factory import cli_ingest, make_event, malformed, new_topic

N_EVENTS = 200_000
MIN_KILLS = 6
MAX_BYTES = 1 << 16


def produce(bootstrap: str, topic: str, rng: random.Random, valid: list, bad: list) -> None:
    """Alternate runs of JSON messages and compact batches, with malformed messages between."""
    json_out = EventProducer(bootstrap, encoding="json")
    compact_out = EventProducer(bootstrap, encoding="compact", batch_events=250)
    try:
        for start in range(0, N_EVENTS, 10_000):
            producer = json_out if (start // 10_000) % 4 == 0 else compact_out
            for i in range(start, start + 10_000):
                if i % 200 == 13:
                    bad.append(f"bad-{i}")
                    json_out.send_raw(topic, malformed(i, rng, MAX_BYTES)[0])
                    continue
                event = make_event(KIND_NAMES[i % len(KIND_NAMES)], i, rng, unicode=False)
                valid.append(event["event_id"])
                producer.send(topic, event)
            producer.flush()
            # paced (>= 12 s in all), so that the kills land while the topic still grows: a
            # consumer faster than the producer would otherwise catch up within one child's life
            time.sleep(0.6)
    finally:
        json_out.close()
        compact_out.close()


@pytest.mark.slow
def test_sigkill_at_random_moments_keeps_the_store_exactly_once(kafka_bootstrap, tmp_path):
    seed = int(os.environ.get("RANKSTREAM_CRASH_SEED", time.time_ns() % 1_000_000))
    print(f"crash test seed {seed} (set RANKSTREAM_CRASH_SEED to repeat)")
    rng = random.Random(seed)
    topic = new_topic(kafka_bootstrap, partitions=3, prefix="crash")
    home = tmp_path / "home"
    store = LocalEventStore(home / "store", home / "dead-letter")
    valid, bad = [], []
    producer = threading.Thread(target=produce, args=(kafka_bootstrap, topic,
                                                      random.Random(seed), valid, bad))
    producer.start()
    args = ("--group", new_group_id("crash"), "--instance-id", "crash-test-consumer",
            "--dead-letter-topic", f"dlq-{topic}", "--flush-events", "4000",
            "--flush-interval", "0.3", "--max-poll-records", "3000",
            "--max-message-bytes", str(MAX_BYTES))
    kills, progress, leftovers, final = 0, [], 0, None
    try:
        # at least MIN_KILLS kills, and on until production ends and the kills have hit the
        # child after it stored something at least twice (a child needs ~1 s to start)
        while kills < MIN_KILLS or producer.is_alive() or (len(set(progress)) < 3
                                                           and kills < 4 * MIN_KILLS):
            child = cli_ingest(home, kafka_bootstrap, topic, *args)
            time.sleep(rng.uniform(1.0, 4.0))
            assert child.poll() is None, (home / "child.log").read_text()[-3000:]
            child.send_signal(signal.SIGKILL)
            child.wait(timeout=30)
            kills += 1
            leftovers += bool(store.segments(complete=False))
            progress.append(sum(store.next_offsets().values()))
        producer.join()
        final = cli_ingest(home, kafka_bootstrap, topic, "--until-end", *args)
        assert final.wait(timeout=300) == 0, (home / "child.log").read_text()[-3000:]
    finally:
        if final is not None and final.poll() is None:
            final.kill()                     # the process this test started
            final.wait(timeout=30)
        producer.join(timeout=60)
    print(f"{kills} kills; stored messages after each: {progress}; "
          f"{leftovers} kills left an unfinished flush behind")

    assert kills >= MIN_KILLS and len(set(progress)) >= 3      # kills landed mid-stream
    stored = Counter()
    for kind in KIND_NAMES:
        stored.update(store.read(kind, columns=["event_id"]).column("event_id").to_pylist())
    assert len(valid) + len(bad) == N_EVENTS
    assert stored == Counter(valid), (
        f"missing {len(set(valid) - set(stored))}, "
        f"duplicated {sum(1 for c in stored.values() if c > 1)}")
    raws = store.read_dead_letters().column("raw").to_pylist()
    markers = Counter(re.search(rb"bad-\d+", raw).group().decode() for raw in raws)
    assert markers == Counter(bad)
    assert store.segments(complete=False) == []
