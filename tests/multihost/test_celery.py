"""Airflow 3 on two Celery workers that share nothing but the store, Redis and Kafka (their own
working directories, AIRFLOW_HOMEs and hostnames, as two hosts would have), its metadata DB and
Celery's results in a private PostgreSQL, Celery's broker in a private redis-server. The four
model families' DAGs run to success with tasks on both workers and publish strictly increasing
versions; a worker SIGKILLed mid-train (its whole process tree, as if its host died) is survived:
Airflow retries the task on the other worker, and nothing is lost, duplicated or published twice.

Everything is started once for the module (infra/ scripts) and stopped by pid at the end.
"""

from __future__ import annotations

import json
import os
import signal
import time
import uuid
from collections import Counter
from pathlib import Path

import pytest
import redis

from pipeline.ingest import synthetic
from pipeline.ingest.events import default_topic
from pipeline.ingest.producer import EventProducer
from pipeline.serving.layout import ModelKeys
from tests.conftest import unavailable
from tests.multihost.celery_servers import celery_airflow, listening, postgres
from tests.servers import infra_server

pytestmark = [pytest.mark.airflow, pytest.mark.slow]

# the gate always publishes (a large tolerance, the trivial list when no better): what is tested
# here is where tasks run and what reaches Redis, not model quality
GATE = '{ tolerance = 100.0, if_trivial = "publish_trivial" }'
CONFIG = f"""
[models.movies]
algorithm = "altsvm"
kinds = ["rating"]
evaluation = {{ holdout = 4 }}
gate = {GATE}
[models.movies.params]
rank = 8
item_bias = true
comparisons = "mixed"
max_iter = 30
reg_ratio = 0.3
random_state = 0
n_threads = 1

[models.ads]
algorithm = "toppush"
kinds = ["outcome"]
params = {{ reg = 1.0 }}
gate = {GATE}

[models.search]
algorithm = "kernel_ranksvm"
kinds = ["judgment"]
params = {{ n_threads = 1 }}
gate = {GATE}

[models.reviews]
algorithm = "npsvor"
kinds = ["ordinal"]
params = {{ tol = 0.01, text_features = 65536, random_state = 0 }}
gate = {GATE}

# trained only by the kill test: a fixed number of iterations (tol 0 never stops it early) on
# its own topic, long enough to be killed in the middle
[models.slow]
algorithm = "altsvm"
kinds = ["interaction"]
evaluation = {{ holdout = 4 }}
gate = {GATE}
params = {{ rank = 48, max_iter = 60, tol = 1e-12, reg_ratio = 0.3, random_state = 0 }}
"""
FAMILIES = {"movies": "rating", "ads": "outcome", "search": "judgment", "reviews": "ordinal"}
# a task heartbeats every 2 s; one without a heartbeat for 10 s (its worker is gone) is failed,
# and retried, by the scheduler, which looks every second (Airflow's defaults: 5 s, 300 s, 10 s)
AIRFLOW_TIMING = {
    "AIRFLOW__WORKERS__MIN_HEARTBEAT_INTERVAL": "2",
    "AIRFLOW__SCHEDULER__TASK_INSTANCE_HEARTBEAT_TIMEOUT": "10",
    "AIRFLOW__SCHEDULER__TASK_INSTANCE_HEARTBEAT_TIMEOUT_DETECTION_INTERVAL": "1",
    # manual runs only: no scheduled run of any DAG, and none is paused when parsed
    "AIRFLOW__SCHEDULER__USE_JOB_SCHEDULE": "False",
    "AIRFLOW__CORE__DAGS_ARE_PAUSED_AT_CREATION": "False",
    # the DAG file is parsed once: no re-parse every 30 s taking a core from the tasks
    "AIRFLOW__DAG_PROCESSOR__MIN_FILE_PROCESS_INTERVAL": "600",
}
RUN_TIMEOUT = 420
TEST_TIMEOUT = 600      # each test, all waits included (no pytest-timeout here: SIGALRM)


@pytest.fixture(autouse=True)
def _time_limit():
    def expired(signum, frame):
        pytest.fail(f"the test ran past {TEST_TIMEOUT} s", pytrace=False)

    previous = signal.signal(signal.SIGALRM, expired)
    signal.alarm(TEST_TIMEOUT)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


# Where the workers' shared data lives, each test once per store: "home", one local directory
# as every worker's RANKSTREAM_HOME; "s3", RANKSTREAM_STORE=s3://... on the S3 server of
# tests/multihost/conftest.py, each worker keeping its own RANKSTREAM_HOME (worker-N/home)
STORES = ("home", "s3")


@pytest.fixture(scope="module", params=STORES)
def shared_storage(request, tmp_path_factory) -> dict:
    """The environment that makes both workers see one event store, run directories and
    checkpoints (given to every process); the only place the storage is chosen. Module-scoped
    and parametrized: the cluster is started once per store, and every test runs on each."""
    if request.param == "s3":
        aws = request.getfixturevalue("object_store_env")    # also set in os.environ
        return {"RANKSTREAM_STORE": f"s3://rankstream/celery-{uuid.uuid4().hex[:12]}", **aws}
    # the workers keep separate working directories and AIRFLOW_HOMEs; only this is shared
    return {"RANKSTREAM_HOME": str(tmp_path_factory.mktemp("shared-home"))}


@pytest.fixture(scope="module")
def cluster(tmp_path_factory, kafka_bootstrap, shared_storage):
    """PostgreSQL, a redis-server (db 0: the models, db 1: Celery's broker) and Airflow on two
    Celery workers; yields ``(airflow, redis URL of the models, their namespace)``."""
    tmp = tmp_path_factory.mktemp("celery")
    config = tmp / "models.toml"
    config.write_text(CONFIG)
    namespace = f"cel{uuid.uuid4().hex[:8]}"
    host, port = kafka_bootstrap.split(":")
    try:
        with infra_server("redis", tmp) as redis_port, postgres(tmp) as pg_env:
            models_url = f"redis://127.0.0.1:{redis_port}/0"
            base = {k: v for k, v in os.environ.items()
                    if not k.startswith(("RANKSTREAM_", "AIRFLOW", "AWS_"))}
            env = {
                **base, **pg_env, **AIRFLOW_TIMING, **shared_storage,
                "RANKSTREAM_CELERY_BROKER": f"redis://127.0.0.1:{redis_port}/1",
                "RANKSTREAM_CONFIG": str(config),
                "RANKSTREAM_NAMESPACE": namespace,
                "RANKSTREAM_LEASE_TTL": "10",      # a dead host's lease is gone in 10 s
                "RANKSTREAM_RETRY_DELAY": "1",
                "AIRFLOW_CONN_RANKSTREAM_KAFKA": json.dumps(
                    {"conn_type": "generic", "host": host, "port": int(port)}),
                "AIRFLOW_CONN_RANKSTREAM_REDIS": models_url,
            }
            with celery_airflow(tmp, env) as airflow:
                airflow.wait_for_dags([f"rankstream_{m}" for m in [*FAMILIES, "slow"]])
                yield airflow, models_url, namespace
    except RuntimeError as err:
        unavailable(str(err))


def _produce(kafka_bootstrap: str, kind: str, events: list[dict]) -> None:
    with EventProducer(kafka_bootstrap) as producer:
        producer.send_many(default_topic(kind), events, kind)


def _batch(namespace: str, round_: int) -> dict[str, list[dict]]:
    """A small batch of every family's events, new ones each round."""
    prefix, seed = f"{namespace}r{round_}", 10 + round_
    return {
        "rating": synthetic.rating_events(n_users=200, n_items=100, per_user=25, seed=seed,
                                          id_prefix=prefix),
        "outcome": synthetic.outcome_events(n_items=2000, seed=seed, id_prefix=prefix),
        "judgment": synthetic.judgment_events(n_queries=60, docs_per_query=10, seed=seed,
                                              id_prefix=prefix),
        "ordinal": synthetic.ordinal_events(n_items=150, n_reviews=1500, seed=seed,
                                            id_prefix=prefix),
    }


def _versions(client: redis.Redis, namespace: str, model: str) -> list[int]:
    return [int(v) for v in client.lrange(ModelKeys(namespace, model).versions, 0, -1)]


def _served(client: redis.Redis, namespace: str, model: str) -> int | None:
    current = client.get(ModelKeys(namespace, model).current)
    return None if current is None else int(current.decode().split(":")[0])


def _assert_stored_once(storage: dict, events: dict[str, list[dict]]) -> None:
    """Every produced event is in the event store exactly once (other tests' events on the
    session's shared topics are left out by their ids)."""
    from pipeline.ingest.open_store import open_store
    from pipeline.settings import Settings

    store = open_store(Settings.load(environ=storage))
    for kind, sent in events.items():
        ids = {e["event_id"] for e in sent}
        stored = Counter(i for i in store.read(kind, columns=["event_id"])["event_id"]
                         .to_pylist() if i in ids)
        missing = ids - set(stored)
        twice = {i: n for i, n in stored.items() if n > 1}
        assert not missing and not twice, (kind, len(missing), twice)


def test_every_family_runs_on_both_workers_and_publishes_increasing_versions(
        cluster, kafka_bootstrap, shared_storage):
    airflow, models_url, namespace = cluster
    client = redis.Redis.from_url(models_url)
    dag_ids = [f"rankstream_{m}" for m in FAMILIES]
    sent: dict[str, list[dict]] = {kind: [] for kind in FAMILIES.values()}
    served_before = {m: None for m in FAMILIES}
    hostnames = Counter()
    for round_ in (1, 2):
        for kind, events in _batch(namespace, round_).items():
            _produce(kafka_bootstrap, kind, events)
            sent[kind] += events
        started = time.monotonic()
        runs = {}
        for dag in dag_ids:          # all at once: their ingest tasks run side by side
            runs[dag] = airflow.trigger(dag)
        states = airflow.wait(runs, timeout=RUN_TIMEOUT)
        print(f"round {round_}: 4 DAGs in {time.monotonic() - started:.1f} s")
        assert set(states.values()) == {"success"}, (
            states, {w: airflow.task_log(w) for w in airflow.workers})
        for dag, run in runs.items():
            tis = airflow.task_instances(dag, run)
            assert {t["state"] for t in tis} == {"success"}, (dag, tis)
            hostnames.update(t["hostname"] for t in tis)
        for model in FAMILIES:
            versions = _versions(client, namespace, model)
            assert versions == sorted(set(versions)), (model, versions)   # strictly increasing
            served = _served(client, namespace, model)
            assert served == versions[-1], (model, served, versions)
            assert served_before[model] is None or served > served_before[model], (
                model, served_before[model], served)
            served_before[model] = served
        if round_ == 1:
            # nothing of ours listens beyond loopback: not the api-server, not a worker
            ours = airflow.our_pids()
            sockets = listening(ours)
            assert sockets and all(addr.startswith("127.0.0.1:") for addr, _ in sockets), \
                sockets
    # every task ran on one of the two workers, and each worker ran some
    assert set(hostnames) == set(airflow.workers), hostnames
    _assert_stored_once(shared_storage, sent)


def test_a_worker_killed_mid_train_is_retried_on_the_other(cluster, kafka_bootstrap,
                                                           shared_storage):
    airflow, models_url, namespace = cluster
    client = redis.Redis.from_url(models_url)
    keys = ModelKeys(namespace, "slow")
    ratings = synthetic.rating_events(n_users=1000, n_items=500, per_user=25, seed=21,
                                      id_prefix=f"{namespace}k")
    interactions = [{k: v for k, v in e.items() if k != "rating"} for e in ratings]
    _produce(kafka_bootstrap, "interaction", interactions)
    dag = "rankstream_slow"
    started = time.monotonic()
    run = airflow.trigger(dag)
    victim = None
    deadline = time.monotonic() + RUN_TIMEOUT
    while victim is None:
        assert time.monotonic() < deadline, airflow.task_instances(dag, run)
        train = {t["task_id"]: t for t in airflow.task_instances(dag, run)}.get("train", {})
        assert train.get("state") not in ("success", "failed"), \
            f"train ended before it could be killed: {train}"
        # running, and holding the model's lease: inside train_step, fitting
        if train.get("state") == "running" and train.get("hostname") and client.get(keys.lease):
            victim = train["hostname"]
        else:
            time.sleep(0.2)
    assert victim in airflow.workers, victim
    time.sleep(0.5)
    killed = airflow.lose_host(victim)
    killed_at = time.monotonic()
    while [p for p in killed if Path(f"/proc/{p}").exists()]:   # reaped by init
        assert time.monotonic() < killed_at + 10, "the lost host's processes are still there"
        time.sleep(0.1)
    state = airflow.wait({dag: run}, timeout=RUN_TIMEOUT)[dag]
    print(f"killed {victim} ({len(killed)} processes) {killed_at - started:.1f} s after the "
          f"trigger; the run ended {time.monotonic() - killed_at:.1f} s later")
    survivor = next(w for w in airflow.workers if w != victim)
    assert state == "success", airflow.task_log(survivor)
    tries = airflow.tries(dag, run, "train")
    assert [t["hostname"] for t in tries] == [victim, survivor], tries
    assert tries[0]["state"] != "success" and tries[-1]["state"] == "success", tries
    after = [t for t in airflow.task_instances(dag, run)
             if t["task_id"] in ("evaluate_and_gate", "publish", "prune")]
    assert {t["hostname"] for t in after} == {survivor}, after
    # one version, published once, by the retry; and every event stored exactly once
    assert _versions(client, namespace, "slow") == [1]
    assert _served(client, namespace, "slow") == 1
    assert client.get(keys.lease) is None
    _assert_stored_once(shared_storage, {"interaction": interactions})
