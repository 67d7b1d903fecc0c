"""Ingest throughput: a bare kafka-python consume loop vs ``ingest_kafka(until_end=True)``.

Produces N rating events (default 1M) into a real local broker, once per encoding (JSON: one
message per event; compact: msgpack column batches), then times, ``--repeats`` times each and
interleaved,

(a) a bare kafka-python consumer in a fresh group that only iterates the messages, and
(b) ``pipeline.ingest.ingest_kafka(until_end=True)`` (what ``rankstream ingest --until-end``
    runs) into a fresh store: decode, validate, Arrow columns, durable Parquet segments, commit.

Both use the same consumer settings (fetch sizes, ``check_crcs``) and include the group join.
Prints events/s (median and range) and the ratio ingest/bare per encoding, with the machine's
load. Targets: ratio >= 0.5; compact ingest >= 100k events/s.

If ``RANKSTREAM_KAFKA_BOOTSTRAP`` (or ``--bootstrap``) is unset, a broker is started with
``infra/kafka/start.sh`` on a free port and stopped by its pid at the end.

    .venv/bin/python bench/ingest_throughput.py                  # 1M events, 3 repeats
    .venv/bin/python bench/ingest_throughput.py --events 200000 --no-check-crcs
"""

from __future__ import annotations

import argparse
import logging
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from contextlib import contextmanager
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from pipeline.ingest.kafka import FETCH_CONFIG, ingest_kafka, new_group_id  # noqa: E402
from pipeline.ingest.producer import EventProducer  # noqa: E402
from pipeline.settings import Settings  # noqa: E402


@contextmanager
def broker(bootstrap: str | None):
    """A broker address: the given one, or a broker started (and stopped) for this run."""
    if bootstrap:
        yield bootstrap
        return
    from tests.servers import free_port

    port = free_port(pair=True)
    state = Path(tempfile.mkdtemp(prefix="bench-kafka-"))
    env = {**os.environ, "RANKSTREAM_KAFKA_PORT": str(port),
           "RANKSTREAM_KAFKA_DIR": str(state / "kafka")}
    print(f"starting a Kafka broker on 127.0.0.1:{port} (infra/kafka/start.sh) ...", flush=True)
    subprocess.run([REPO / "infra/kafka/start.sh"], env=env, check=True, capture_output=True)
    try:
        yield f"127.0.0.1:{port}"
    finally:
        subprocess.run([REPO / "infra/kafka/stop.sh"], env=env, capture_output=True)
        shutil.rmtree(state, ignore_errors=True)
        print("broker stopped", flush=True)


def rating_events(n: int):
    for i in range(n):
        yield {"kind": "rating", "event_id": f"ev-{i:09d}", "ts": 1_700_000_000_000 + i,
               "user": i % 943 + 1, "item": (i * 7) % 1682 + 1, "rating": float(i % 5 + 1)}


def produce(bootstrap: str, encoding: str, n: int, partitions: int) -> tuple[str, int, float]:
    from kafka.admin import KafkaAdminClient, NewTopic

    topic = f"bench-{encoding}-{uuid.uuid4().hex[:8]}"
    admin = KafkaAdminClient(bootstrap_servers=bootstrap)
    admin.create_topics([NewTopic(topic, partitions, 1)])
    admin.close()
    started = time.perf_counter()
    with EventProducer(bootstrap, encoding=encoding, batch_events=1000) as producer:
        producer.send_many(topic, rating_events(n))
    return topic, producer.messages, time.perf_counter() - started


def bare_consume(bootstrap: str, topic: str, messages: int, check_crcs: bool) -> float:
    from kafka import KafkaConsumer

    started = time.perf_counter()
    consumer = KafkaConsumer(topic, bootstrap_servers=bootstrap, group_id=new_group_id("bare"),
                             enable_auto_commit=False, auto_offset_reset="earliest",
                             check_crcs=check_crcs, max_poll_records=20_000, **FETCH_CONFIG)
    seen = 0
    while seen < messages:
        for records in consumer.poll(timeout_ms=500).values():
            for _ in records:
                seen += 1
    consumer.close(autocommit=False)
    return time.perf_counter() - started


def ingest(bootstrap: str, topic: str, n: int, check_crcs: bool) -> float:
    home = Path(tempfile.mkdtemp(prefix="bench-store-"))
    try:
        settings = Settings(home=home, kafka_bootstrap=bootstrap)
        started = time.perf_counter()
        summary = ingest_kafka([topic], settings=settings, group_id=new_group_id("bench"),
                               until_end=True, progress=False, check_crcs=check_crcs)
        seconds = time.perf_counter() - started
        stored = sum(summary.events.values())
        if stored != n:
            raise RuntimeError(f"ingest stored {stored} events, expected {n}")
        return seconds
    finally:
        shutil.rmtree(home, ignore_errors=True)


def machine_state() -> str:
    load = ", ".join(f"{x:.2f}" for x in os.getloadavg())
    return (f"{os.cpu_count()} cores, load average {load}, Python {platform.python_version()}; "
            "the machine is shared with other engineers, so absolute numbers vary run to run")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--events", type=int, default=1_000_000)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--partitions", type=int, default=1)
    parser.add_argument("--encodings", default="json,compact")
    parser.add_argument("--no-check-crcs", dest="check_crcs", action="store_false")
    parser.add_argument("--bootstrap", default=os.environ.get("RANKSTREAM_KAFKA_BOOTSTRAP"))
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.CRITICAL)
    from kafka.record.util import crc32c_c

    crc_impl = "C (crc32c package)" if crc32c_c is not None else "pure Python"
    print(f"machine: {machine_state()}")
    print(f"{args.events:,} rating events, {args.partitions} partition(s), {args.repeats} "
          f"repeats, check_crcs={args.check_crcs} (CRC32C in {crc_impl})\n", flush=True)
    rows = []
    with broker(args.bootstrap) as bootstrap:
        for encoding in args.encodings.split(","):
            topic, messages, seconds = produce(bootstrap, encoding, args.events, args.partitions)
            print(f"{encoding}: produced {args.events:,} events in {messages:,} messages, "
                  f"{args.events / seconds:,.0f} events/s", flush=True)
            bare, full = [], []
            for r in range(args.repeats):
                bare.append(bare_consume(bootstrap, topic, messages, args.check_crcs))
                full.append(ingest(bootstrap, topic, args.events, args.check_crcs))
                print(f"  repeat {r + 1}: bare {args.events / bare[-1]:,.0f} events/s, "
                      f"ingest {args.events / full[-1]:,.0f} events/s", flush=True)
            rows.append((encoding, messages, bare, full))
    print(f"\nmachine after: {machine_state()}\n")
    print(f"{'encoding':<9} {'messages':>10} {'bare ev/s (median, range)':>34} "
          f"{'ingest ev/s (median, range)':>34} {'ratio':>6}")
    n = args.events
    for encoding, messages, bare, full in rows:
        b, f = n / statistics.median(bare), n / statistics.median(full)
        bare_range = f"({n / max(bare):,.0f}-{n / min(bare):,.0f})"
        full_range = f"({n / max(full):,.0f}-{n / min(full):,.0f})"
        print(f"{encoding:<9} {messages:>10,} {b:>12,.0f} {bare_range:<21} "
              f"{f:>12,.0f} {full_range:<21} {f / b:>6.2f}")
    compact = [n / statistics.median(full) for e, _, _, full in rows if e == "compact"]
    ratios = [statistics.median(bare) / statistics.median(full) for _, _, bare, full in rows]
    print(f"\ntargets: ratio >= 0.5: {'met' if min(ratios) >= 0.5 else 'NOT met'}"
          + (f"; compact >= 100k events/s: {'met' if compact[0] >= 100_000 else 'NOT met'}"
             if compact else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
