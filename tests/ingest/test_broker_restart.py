"""The local broker keeps its data across a restart; `infra/kafka/start.sh --fresh` wipes it.
(Before, every start wiped it, and a restarted broker's re-created topics began at offset 0.)"""

from __future__ import annotations

import os
import subprocess

import pytest

from tests.servers import INFRA, free_port

pytestmark = [pytest.mark.kafka, pytest.mark.slow]


def _broker(env, *args):
    out = subprocess.run([INFRA / "kafka" / "start.sh", *args], env=env, capture_output=True,
                         text=True, timeout=300)
    if out.returncode != 0:
        if os.environ.get("CI"):
            raise RuntimeError(f"start.sh failed: {out.stdout}\n{out.stderr}")
        pytest.skip(f"no Kafka broker: {out.stderr.strip()[-300:]}")


def _stop(env):
    subprocess.run([INFRA / "kafka" / "stop.sh"], env=env, capture_output=True, timeout=60)


def _messages(bootstrap: str, topic: str) -> list:
    from kafka import KafkaConsumer

    consumer = KafkaConsumer(topic, bootstrap_servers=bootstrap, auto_offset_reset="earliest",
                             enable_auto_commit=False, consumer_timeout_ms=5000)
    try:
        return [m.value for m in consumer]
    finally:
        consumer.close()


def test_the_broker_keeps_its_data_across_a_restart_unless_fresh(tmp_path):
    from kafka import KafkaProducer

    port = free_port(pair=True)
    env = {**os.environ, "RANKSTREAM_KAFKA_PORT": str(port),
           "RANKSTREAM_KAFKA_DIR": str(tmp_path / "kafka")}
    bootstrap = f"127.0.0.1:{port}"
    _broker(env)
    try:
        producer = KafkaProducer(bootstrap_servers=bootstrap)
        for i in range(3):
            producer.send("kept", f"m{i}".encode())
        producer.flush()
        producer.close()
        _stop(env)
        _broker(env)                                    # a plain restart: the topic is there
        assert _messages(bootstrap, "kept") == [b"m0", b"m1", b"m2"]
        _stop(env)
        _broker(env, "--fresh")                         # asked for: a new, empty broker
        assert _messages(bootstrap, "kept") == []
    finally:
        _stop(env)
