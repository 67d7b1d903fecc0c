"""A replicated Kafka (infra/kafka/cluster-start.sh: 3 KRaft brokers, replication factor 3,
min.insync.replicas 2): a broker SIGKILLed while events are produced and ingested loses
nothing and duplicates nothing in the event store, and ingestion goes on on the survivors."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import threading
import time
from contextlib import contextmanager

import pytest

from pipeline.ingest.local_store import LocalEventStore
from pipeline.ingest.producer import EventProducer
from tests.conftest import unavailable
from tests.ingest.factory import cli_ingest, make_event
from tests.servers import INFRA, free_port_block

pytestmark = [pytest.mark.kafka, pytest.mark.slow]


@contextmanager
def kafka_cluster(tmp_path):
    """(bootstrap, env, state dir) of a 3-broker cluster on free ports; stopped by pid after."""
    base = free_port_block(6, offset=0)
    state = tmp_path / "kafka-cluster"
    env = {**os.environ, "RANKSTREAM_KAFKA_CLUSTER_PORT": str(base),
           "RANKSTREAM_KAFKA_CLUSTER_DIR": str(state)}
    start = subprocess.run([INFRA / "kafka" / "cluster-start.sh"], env=env, capture_output=True,
                           text=True, timeout=300)
    try:
        if start.returncode != 0:
            unavailable(f"kafka cluster-start.sh failed: {start.stderr.strip()[-400:]}")
        yield ",".join(f"127.0.0.1:{base + i}" for i in range(3)), env, state
    finally:
        subprocess.run([INFRA / "kafka" / "cluster-stop.sh"], env=env, capture_output=True,
                       timeout=120)


def _kill_node(state, node: int) -> None:
    """SIGKILL (a crash, no clean shutdown) the broker this test's cluster started as node N,
    after checking the pid is that broker."""
    pid = int((state / f"node-{node}" / "kafka.pid").read_text())
    cmdline = (open(f"/proc/{pid}/cmdline", "rb").read().replace(b"\0", b" ").decode())
    assert f"kafka.Kafka {state}/node-{node}/" in cmdline, cmdline
    os.kill(pid, signal.SIGKILL)


def _leader_of(bootstrap: str, topic: str) -> int:
    from kafka.admin import KafkaAdminClient

    admin = KafkaAdminClient(bootstrap_servers=bootstrap)
    try:
        partition = admin.describe_topics([topic])[0]["partitions"][0]
        return int(partition.get("leader_id", partition.get("leader")))
    finally:
        admin.close()


def test_a_broker_killed_during_ingestion_loses_and_duplicates_nothing(tmp_path):
    from kafka.admin import KafkaAdminClient, NewTopic

    with kafka_cluster(tmp_path) as (bootstrap, env, state):
        topic = "ratings-replicated"
        admin = KafkaAdminClient(bootstrap_servers=bootstrap)
        admin.create_topics([NewTopic(topic, 2, 3)])
        admin.close()
        home = tmp_path / "home"
        n, sent = 6000, []

        def produce():
            rng = random.Random(0)
            with EventProducer(bootstrap) as producer:   # acks=all, idempotent (the defaults)
                for i in range(n):
                    event = make_event("rating", i, rng)
                    producer.send(topic, event)
                    sent.append(event["event_id"])
                    if i % 500 == 499:
                        producer.flush()
                        time.sleep(0.2)

        writer = threading.Thread(target=produce)
        writer.start()
        ingest = cli_ingest(home, bootstrap, topic, "--kind", "rating")
        try:
            while len(sent) < n // 3:
                time.sleep(0.05)
            _kill_node(state, _leader_of(bootstrap, topic))   # the partition leader, mid-run
            writer.join(timeout=240)
            assert not writer.is_alive() and len(sent) == n
            store = LocalEventStore(home / "store")
            deadline = time.monotonic() + 180
            while time.monotonic() < deadline:
                if sum(o for (t, _), o in store.next_offsets([topic]).items()) >= n:
                    break
                assert ingest.poll() is None, (home / "child.log").read_text()[-2000:]
                time.sleep(0.5)
        finally:
            ingest.send_signal(signal.SIGTERM)     # the process this test started
            ingest.wait(timeout=60)
        stored = LocalEventStore(home / "store").read("rating", columns=["event_id"])
        ids = stored.column("event_id").to_pylist()
        assert len(ids) == n, f"{len(ids)} stored of {n} sent"
        assert set(ids) == set(sent) and len(set(ids)) == n      # none lost, none twice
