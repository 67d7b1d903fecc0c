"""Ingest throughput: a bare kafka-python consume loop vs ``ingest_kafka(until_end=True)``, and
two ingest processes of one consumer group vs one.

Produces rating events into a real local broker, once per encoding (compact: msgpack column
batches of 1000 events, ``--events``, default 1M; JSON: one message per event,
``--json-events``, default 200k), then times, ``--repeats`` times each and interleaved,

(a) a bare kafka-python consumer in a fresh group that only iterates the messages (with the C
    CRC32C check of the ``crc32c`` package when it is installed, as the header says), and
(b) ``pipeline.ingest.ingest_kafka(until_end=True)`` (what ``rankstream ingest --until-end``
    runs) into a fresh store: decode, validate, Arrow columns, durable Parquet segments, commit.

Both use the same consumer settings (fetch sizes, ``check_crcs``) and include the group join.
Prints events/s (median and range) and the ratio ingest/bare per encoding, with the machine's
load, and the CPU seconds the ingesting process used (the machine is shared: CPU time is the
steadier figure).

Then (unless ``--no-processes``) ``--group-events`` compact events (default 2M) go to a
2-partition topic, and one ``ingest_kafka`` process, then two processes in one consumer group
sharing one store, drain it (worker processes started and warmed up first, then released
together; events/s over the whole run from the first start to the last end). Every run is
checked: each event id stored exactly once.

Targets (issue 17): compact ingest >= 0.5x the bare loop and >= 1.5M events/s; two processes
at least as fast as one.

If ``RANKSTREAM_KAFKA_BOOTSTRAP`` (or ``--bootstrap``) is unset, a broker is started with
``infra/kafka/start.sh`` on a free port and stopped by its pid at the end.

    .venv/bin/python bench/ingest_throughput.py                  # 1M compact, 200k JSON, 3 repeats
    .venv/bin/python bench/ingest_throughput.py --events 200000 --encodings compact
"""

from __future__ import annotations

import argparse
import json
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

from pipeline.ingest.buffer import load_fast_path  # noqa: E402
from pipeline.ingest.kafka import FETCH_CONFIG, ingest_kafka, new_group_id  # noqa: E402
from pipeline.ingest.producer import EventProducer  # noqa: E402
from pipeline.settings import Settings, state_dir  # noqa: E402


@contextmanager
def broker(bootstrap: str | None):
    """A broker address: the given one, or a broker started (and stopped) for this run."""
    if bootstrap:
        yield bootstrap
        return
    from tests.servers import free_port

    port = free_port(pair=True)
    state = Path(tempfile.mkdtemp(prefix="bench-kafka-", dir=state_dir("bench")))
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


def crc_implementation() -> str:
    """Which CRC32C kafka-python checks records with: the function its record reader binds."""
    from kafka.record import util

    active = util.calc_crc32c.__defaults__[0]
    if util.crc32c_c is not None and active is util.crc32c_c:
        import crc32c

        how = "hardware" if getattr(crc32c, "hardware_based", False) else "software"
        return f"C, crc32c {_version('crc32c')} ({how})"
    return "pure Python (kafka.record._crc32c; pip install crc32c for C)"


def _version(package: str) -> str:
    from importlib.metadata import version

    return version(package)


def rating_events(n: int, start: int = 0):
    for i in range(start, start + n):
        yield {"kind": "rating", "event_id": f"ev-{i:09d}", "ts": 1_700_000_000_000 + i,
               "user": i % 943 + 1, "item": (i * 7) % 1682 + 1, "rating": float(i % 5 + 1)}


def produce(bootstrap: str, encoding: str, n: int, partitions: int) -> tuple[str, int, float]:
    """A new topic holding ``n`` rating events, split evenly over its partitions."""
    from kafka.admin import KafkaAdminClient, NewTopic

    topic = f"bench-{encoding}-{uuid.uuid4().hex[:8]}"
    admin = KafkaAdminClient(bootstrap_servers=bootstrap)
    admin.create_topics([NewTopic(topic, partitions, 1)])
    admin.close()
    started = time.perf_counter()
    share = -(-n // partitions)
    with EventProducer(bootstrap, encoding=encoding, batch_events=1000) as producer:
        for p in range(partitions):
            producer.send_many(topic, rating_events(min(share, n - p * share), p * share),
                               partition=p)
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


def ingest(bootstrap: str, topic: str, n: int, check_crcs: bool) -> tuple[float, float]:
    """Seconds (wall, CPU of this process) of one ``ingest_kafka(until_end=True)`` run."""
    home = Path(tempfile.mkdtemp(prefix="bench-store-", dir=state_dir("bench")))
    try:
        settings = Settings(home=home, kafka_bootstrap=bootstrap)
        started, cpu = time.perf_counter(), time.process_time()
        summary = ingest_kafka([topic], settings=settings, group_id=new_group_id("bench"),
                               until_end=True, progress=False, check_crcs=check_crcs)
        seconds, cpu = time.perf_counter() - started, time.process_time() - cpu
        stored = sum(summary.events.values())
        if stored != n:
            raise RuntimeError(f"ingest stored {stored} events, expected {n}")
        return seconds, cpu
    finally:
        shutil.rmtree(home, ignore_errors=True)


# ---------------------------------------------------------------- one process vs two

def worker(args) -> int:
    """``--worker``: warm up, say "ready", wait for "go" on stdin, drain the topic into the
    shared store with ``ingest_kafka``, print the run as JSON."""
    logging.basicConfig(level=logging.CRITICAL)
    load_fast_path()
    print("ready", flush=True)
    if sys.stdin.readline().strip() != "go":
        return 1
    start = time.time()
    summary = ingest_kafka([args.topic], settings=Settings(home=args.home,
                                                           kafka_bootstrap=args.bootstrap),
                           group_id=args.group, until_end=True, progress=False,
                           check_crcs=args.check_crcs)
    print(json.dumps({"start": start, "end": time.time(), "pid": os.getpid(),
                      "events": sum(summary.events.values()), "messages": summary.messages}),
          flush=True)
    return 0


def group_run(bootstrap: str, topic: str, n: int, processes: int, check_crcs: bool) -> dict:
    """``processes`` workers of one new group drain ``topic`` into one new store; returns the
    events/s from the first start to the last end, and what each stored."""
    home = Path(tempfile.mkdtemp(prefix="bench-group-", dir=state_dir("bench")))
    group = new_group_id("bench-group")
    cmd = [sys.executable, __file__, "--worker", "--bootstrap", bootstrap, "--topic", topic,
           "--group", group, "--home", str(home)] + ([] if check_crcs else ["--no-check-crcs"])
    children = [subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
                for _ in range(processes)]
    try:
        for child in children:
            if child.stdout.readline().strip() != "ready":
                raise RuntimeError(f"worker {child.pid} did not start")
        for child in children:
            child.stdin.write("go\n")
            child.stdin.flush()
        runs = [json.loads(child.stdout.readline()) for child in children]
        for child in children:
            if child.wait(timeout=600) != 0:
                raise RuntimeError(f"worker {child.pid} exited with {child.returncode}")
        stored, distinct = _stored_ids(home)
        if stored != n or distinct != n:
            raise RuntimeError(f"{processes} process(es) stored {stored} events ({distinct} "
                               f"distinct ids), expected each of {n} exactly once")
        seconds = max(r["end"] for r in runs) - min(r["start"] for r in runs)
        return {"seconds": seconds, "per_process": sorted(r["events"] for r in runs)}
    finally:
        for child in children:
            if child.poll() is None:
                child.kill()
        shutil.rmtree(home, ignore_errors=True)


def _stored_ids(home: Path) -> tuple[int, int]:
    import pyarrow.compute as pc

    from pipeline.ingest.local_store import LocalEventStore

    ids = LocalEventStore(home / "store", home / "dead-letter").read(
        "rating", columns=["event_id"]).column("event_id")
    return len(ids), pc.count_distinct(ids).as_py()


# ---------------------------------------------------------------- report

def machine_state() -> str:
    load = ", ".join(f"{x:.2f}" for x in os.getloadavg())
    return (f"{os.cpu_count()} cores, load average {load}, Python {platform.python_version()}; "
            "the machine is shared with other engineers, so absolute numbers vary run to run")


def rate(n: int, seconds: list[float]) -> str:
    return (f"{n / statistics.median(seconds):>12,.0f} "
            f"({n / max(seconds):,.0f}-{n / min(seconds):,.0f})")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--events", type=int, default=1_000_000, help="compact events")
    parser.add_argument("--json-events", type=int, default=200_000)
    parser.add_argument("--group-events", type=int, default=2_000_000,
                        help="compact events for one vs two processes")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--partitions", type=int, default=1)
    parser.add_argument("--encodings", default="compact,json")
    parser.add_argument("--no-processes", dest="processes", action="store_false",
                        help="skip the one vs two processes measurement")
    parser.add_argument("--no-check-crcs", dest="check_crcs", action="store_false")
    parser.add_argument("--bootstrap", default=os.environ.get("RANKSTREAM_KAFKA_BOOTSTRAP"))
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--topic", help=argparse.SUPPRESS)
    parser.add_argument("--group", help=argparse.SUPPRESS)
    parser.add_argument("--home", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        return worker(args)
    logging.basicConfig(level=logging.CRITICAL)
    started = time.perf_counter()
    if not load_fast_path():
        print("the compact-batch fast path did not load: compact runs take the general path")
    warm = time.perf_counter() - started
    print(f"machine: {machine_state()}")
    print(f"kafka-python {_version('kafka-python')}, CRC32C check in {crc_implementation()}"
          f"{'' if args.check_crcs else ' (disabled: --no-check-crcs)'}; msgspec "
          f"{_version('msgspec')}; compact-batch kernels loaded in {warm:.2f} s before timing (a "
          "first run after install compiles them)")
    print(f"{args.events:,} compact / {args.json_events:,} JSON rating events, "
          f"{args.partitions} partition(s), {args.repeats} repeats\n", flush=True)
    rows = []
    with broker(args.bootstrap) as bootstrap:
        for encoding in args.encodings.split(","):
            n = args.events if encoding == "compact" else args.json_events
            topic, messages, seconds = produce(bootstrap, encoding, n, args.partitions)
            print(f"{encoding}: produced {n:,} events in {messages:,} messages, "
                  f"{n / seconds:,.0f} events/s", flush=True)
            bare, full, cpu = [], [], []
            for r in range(args.repeats):
                bare.append(bare_consume(bootstrap, topic, messages, args.check_crcs))
                wall, used = ingest(bootstrap, topic, n, args.check_crcs)
                full.append(wall)
                cpu.append(used)
                print(f"  repeat {r + 1}: bare {n / bare[-1]:,.0f} events/s, ingest "
                      f"{n / full[-1]:,.0f} events/s ({used:.2f} s CPU)", flush=True)
            rows.append((encoding, n, messages, bare, full, cpu))
        groups = []
        if args.processes:
            n = args.group_events
            topic, messages, _ = produce(bootstrap, "compact", n, 2)
            print(f"\ncompact on 2 partitions: {n:,} events in {messages:,} messages; one "
                  "ingest process vs two in one group (exactly-once checked)", flush=True)
            for r in range(args.repeats):
                for processes in (1, 2):
                    run = group_run(bootstrap, topic, n, processes, args.check_crcs)
                    groups.append((processes, run["seconds"]))
                    print(f"  repeat {r + 1}, {processes} process(es): "
                          f"{n / run['seconds']:,.0f} events/s, events per process "
                          f"{run['per_process']}", flush=True)
    print(f"\nmachine after: {machine_state()}\n")
    print(f"{'encoding':<9} {'events':>10} {'messages':>10} {'bare ev/s (median, range)':>32} "
          f"{'ingest ev/s (median, range)':>32} {'ratio':>6} {'CPU s':>6}")
    ratios, compact = {}, None
    for encoding, n, messages, bare, full, cpu in rows:
        ratios[encoding] = statistics.median(bare) / statistics.median(full)
        compact = n / statistics.median(full) if encoding == "compact" else compact
        print(f"{encoding:<9} {n:>10,} {messages:>10,} {rate(n, bare):>32} "
              f"{rate(n, full):>32} {ratios[encoding]:>6.2f} {statistics.median(cpu):>6.2f}")
    if groups:
        one = [s for p, s in groups if p == 1]
        two = [s for p, s in groups if p == 2]
        ratios["two processes"] = statistics.median(one) / statistics.median(two)
        print(f"\n2 partitions, {args.group_events:,} compact events: 1 process "
              f"{rate(args.group_events, one)} events/s; "
              f"2 processes {rate(args.group_events, two)} events/s; "
              f"ratio {ratios['two processes']:.2f}; every event stored exactly once")
    verdicts = []
    if "compact" in ratios:
        verdicts.append(f"compact ratio >= 0.5: {_met(ratios['compact'] >= 0.5)}")
        verdicts.append(f"compact >= 1.5M events/s: {_met(compact >= 1.5e6)}")
    if "json" in ratios:
        verdicts.append(f"JSON ratio {ratios['json']:.2f} (stated, no target)")
    if "two processes" in ratios:
        verdicts.append(f"two processes >= one: {_met(ratios['two processes'] >= 1.0)}")
    print("\ntargets: " + "; ".join(verdicts))
    return 0


def _met(ok: bool) -> str:
    return "met" if ok else "NOT met"



if __name__ == "__main__":
    sys.exit(main())
