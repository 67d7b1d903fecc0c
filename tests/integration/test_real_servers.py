"""The real parts work: Kafka 4 (KRaft) through kafka-python, redis-server through redis-py,
and Airflow 3 through ``airflow dags test``. These are the foundation every pipeline test uses."""

from __future__ import annotations

import time
import uuid
from pathlib import Path

import pytest

from tests import airflow_runner

N_MESSAGES = 1000


def _consume(consumer, want: int, timeout_s: float = 30.0) -> list:
    got, deadline = [], time.monotonic() + timeout_s
    while len(got) < want and time.monotonic() < deadline:
        for records in consumer.poll(timeout_ms=500, max_records=200).values():
            got.extend(records)
    return got


def test_kafka_round_trip_manual_commit_and_restart(kafka_bootstrap):
    from kafka import KafkaConsumer, KafkaProducer
    from kafka.admin import KafkaAdminClient, NewTopic
    from kafka.structs import OffsetAndMetadata, TopicPartition

    topic, group = f"smoke-{uuid.uuid4().hex}", f"g-{uuid.uuid4().hex}"
    admin = KafkaAdminClient(bootstrap_servers=kafka_bootstrap)
    admin.create_topics([NewTopic(topic, num_partitions=3, replication_factor=1)])
    admin.close()

    producer = KafkaProducer(bootstrap_servers=kafka_bootstrap, acks="all")
    for i in range(N_MESSAGES):
        producer.send(topic, key=str(i % 7).encode(), value=f"m{i}".encode())
    producer.flush()
    producer.close()

    def consumer():
        return KafkaConsumer(topic, bootstrap_servers=kafka_bootstrap, group_id=group,
                             enable_auto_commit=False, auto_offset_reset="earliest")

    first = consumer()
    handled = _consume(first, 600)
    # commit exactly what was handled: per partition, one past the last handled offset
    last: dict[TopicPartition, int] = {}
    for r in handled:
        tp = TopicPartition(r.topic, r.partition)
        last[tp] = max(last.get(tp, -1), r.offset)
    first.commit({tp: OffsetAndMetadata(off + 1, None, -1) for tp, off in last.items()})
    first.close(autocommit=False)

    second = consumer()
    rest = _consume(second, N_MESSAGES - len(handled))
    time.sleep(1.0)  # anything re-delivered would arrive now
    rest += [r for recs in second.poll(timeout_ms=500).values() for r in recs]
    second.close(autocommit=False)

    seen_first = {(r.partition, r.offset) for r in handled}
    assert not seen_first & {(r.partition, r.offset) for r in rest}, "re-delivered after commit"
    values = sorted(int(r.value[1:]) for r in handled + rest)
    assert values == list(range(N_MESSAGES)), "lost or duplicated messages"


def test_redis_set_get_and_pipeline(redis_client):
    redis_client.set("rankstream:smoke", b"\x00\x01payload")
    assert redis_client.get("rankstream:smoke") == b"\x00\x01payload"
    pipe = redis_client.pipeline(transaction=True)
    for i in range(100):
        pipe.rpush("rankstream:list", i)
    pipe.lrange("rankstream:list", 0, -1)
    *pushed, listed = pipe.execute()
    assert pushed[-1] == 100
    assert [int(x) for x in listed] == list(range(100))
    info = redis_client.info("server")
    assert int(str(info["redis_version"]).split(".")[0]) >= 6


SMOKE_DAGS = Path(__file__).resolve().parent.parent / "dags"


def test_trivial_dag_passes_airflow_dags_test(airflow_home):
    env = airflow_runner.airflow_env(airflow_home, SMOKE_DAGS)
    run = airflow_runner.dags_test(env, "rankstream_smoke")
    assert run.returncode == 0, run.stdout[-4000:]
    assert "rankstream smoke ok: 42" in run.stdout
    assert "state=success" in run.stdout


def test_failing_dag_is_reported_as_failed(airflow_home):
    env = airflow_runner.airflow_env(airflow_home, SMOKE_DAGS)
    run = airflow_runner.dags_test(env, "rankstream_smoke_fails")
    assert run.returncode != 0
    assert "this task fails on purpose" in run.stdout


def test_cli_help_lists_subcommands(capsys):
    from pipeline.cli import main

    with pytest.raises(SystemExit) as exit_:
        main(["--help"])
    assert exit_.value.code == 0
    out = capsys.readouterr().out
    for name in ("ingest", "train", "publish", "recommend", "demo"):
        assert f"  {name}" in out


def test_every_cli_subcommand_is_built():
    import importlib

    from pipeline import cli

    for name, (module_name, _) in cli.COMMANDS.items():
        module = importlib.import_module(f"pipeline.cli.{module_name}")
        assert callable(getattr(module, "add_arguments", None)), name
        assert callable(getattr(module, "run", None)), name
