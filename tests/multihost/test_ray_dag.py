"""The DAG's train task on a Ray cluster (issue 52): `airflow dags test rankstream_movies` with
the Connection ``rankstream_ray`` naming a real local cluster (a head and worker nodes, each its
own `ray start` process with its own temp dir on loopback, ``infra/ray/start.sh``), events
from the real Kafka broker into the S3 store, and lists to redis-server. The fit runs on the
workers, and its checkpoint is the one a fit in one process makes of the same window, bit for
bit; the served lists are that fit's."""

from __future__ import annotations

import json
import uuid

import numpy as np
import pytest

from pipeline.ingest import synthetic
from pipeline.ingest.producer import EventProducer
from pipeline.serving.lookup import TopK
from pipeline.settings import Settings
from pipeline.training import retrain
from pipeline.training.checkpoints import latest_checkpoint
from pipeline.training.config import load_models
from pipeline.training.run_store import open_run_store
from tests import airflow_runner
from tests.test_dags import DAGS
from tests.training.test_train_on_ray import CONFIG  # the same small AltSVM

pytestmark = pytest.mark.airflow


def test_the_dags_train_task_fits_on_ray_and_serves_the_one_process_bits(
        tmp_path, airflow_home, kafka_bootstrap, redis_url, ray_address, store_url):
    from pipeline.ingest.events import default_topic

    config = tmp_path / "models.toml"
    config.write_text(CONFIG)
    namespace = f"raydag{uuid.uuid4().hex[:8]}"
    events = synthetic.rating_events(n_users=300, n_items=120, per_user=25, seed=6,
                                     id_prefix=namespace)
    with EventProducer(kafka_bootstrap) as producer:
        producer.send_many(default_topic("rating"), events, "rating")
    kafka_host, kafka_port = kafka_bootstrap.split(":")
    ray_host, ray_port = ray_address.split(":")
    env = airflow_runner.airflow_env(airflow_home, DAGS, {
        "RANKSTREAM_CONFIG": str(config), "RANKSTREAM_HOME": str(tmp_path / "airflow-host"),
        "RANKSTREAM_NAMESPACE": namespace, "RANKSTREAM_STORE": store_url,
        "AIRFLOW_CONN_RANKSTREAM_KAFKA": json.dumps({"conn_type": "generic",
                                                     "host": kafka_host,
                                                     "port": int(kafka_port)}),
        "AIRFLOW_CONN_RANKSTREAM_REDIS": redis_url,
        "AIRFLOW_CONN_RANKSTREAM_RAY": json.dumps({"conn_type": "generic", "host": ray_host,
                                                   "port": int(ray_port)})})
    env.pop("RANKSTREAM_RAY_ADDRESS", None)        # the Connection alone names the cluster
    run = airflow_runner.dags_test(env, "rankstream_movies")
    assert run.returncode == 0, run.stdout[-5000:]
    (fitted,) = (tmp_path / "airflow-host" / "runs" / "movies").glob("*/train.json")
    engine = json.loads(fitted.read_text())["engine"]
    assert engine.startswith(f"Ray at {ray_address}"), engine

    # another host reads the same S3 store and fits the same window in one process
    dag_host = Settings(home=tmp_path / "airflow-host", store=store_url, namespace=namespace)
    open_run_store(dag_host).pull_checkpoints("movies")
    on_ray = latest_checkpoint(dag_host.checkpoint_dir, "movies")
    assert on_ray is not None, "the DAG left no checkpoint in the store"
    trained = json.loads((on_ray.path / "manifest.json").read_text())
    local_host = Settings(home=tmp_path / "local-host", store=store_url,
                          namespace=f"{namespace}l")
    local = retrain.run("movies", load_models(config), settings=local_host,
                        redis_url=redis_url, cold=True)
    assert local["train"]["engine"].startswith("this process"), local["train"]["engine"]
    assert local["dataset"]["window"] == trained["window"], "not the same window"
    here = latest_checkpoint(local_host.checkpoint_dir, "movies")
    warm = sorted(k for k in here.arrays if k.startswith("warm_"))
    assert {"warm_U", "warm_V", "warm_alpha", "warm_beta"} <= set(warm)
    for key in warm:
        assert np.array_equal(here.arrays[key], on_ray.arrays[key]), key
    user = events[0]["user"]
    with TopK(redis_url, namespace=namespace) as dag, \
            TopK(redis_url, namespace=f"{namespace}l") as mine:
        served = dag.recommend("movies", user, k=10)
        assert served.version == 1 and len(served.items) == 10
        assert served.items == mine.recommend("movies", user, k=10).items
