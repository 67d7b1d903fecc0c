"""rankstream retraining DAGs: one per model in the config file, so adding a model is a config
change. ingest -> build dataset -> train (warm start) -> evaluate and gate -> publish -> prune.

Parse-time cost is one small TOML read: no numpy, numba, solver or network imports here (heavy
imports happen inside the tasks). The config path comes from ``RANKSTREAM_CONFIG`` (default:
``dags/models.toml`` beside this file). Kafka and Redis come from the Airflow Connections
``rankstream_kafka`` and ``rankstream_redis`` (``AIRFLOW_CONN_*`` in tests); the working directory
(event store, checkpoints) from ``RANKSTREAM_HOME``. The dataset task snapshots the event store's
offsets; every later task works in that snapshot's run directory (its path is all XCom carries),
so a retried task continues the same run and re-running a window publishes nothing new. A model
with nothing new to learn skips the rest of its run. A failed task is retried 3 times, first after
``RANKSTREAM_RETRY_DELAY`` seconds (default 30), then with exponential backoff up to 15 minutes.
"""

from __future__ import annotations

import logging
import math
import os
import tomllib
from datetime import datetime, timedelta
from pathlib import Path

from airflow.sdk import dag, task

from pipeline.naming import is_valid_name

CONFIG = os.environ.get("RANKSTREAM_CONFIG") or str(Path(__file__).with_name("models.toml"))


def _retry_delay() -> float:
    raw = os.environ.get("RANKSTREAM_RETRY_DELAY") or "30"
    try:
        seconds = float(raw)
    except ValueError:
        seconds = math.nan
    if not (math.isfinite(seconds) and seconds >= 0):
        raise ValueError(f"RANKSTREAM_RETRY_DELAY is {raw!r}, expected seconds >= 0 (e.g. 30)")
    return seconds


RETRY_DELAY = _retry_delay()
DEFAULT_ARGS = {
    "owner": "rankstream",
    "retries": 3,
    "retry_delay": timedelta(seconds=RETRY_DELAY),
    "retry_exponential_backoff": True,
    "max_retry_delay": timedelta(minutes=15),
}


def _model_specs(path: str) -> dict:
    with open(path, "rb") as fh:
        return tomllib.load(fh).get("models", {})


def build_dag(model: str, spec: dict):
    """The retraining DAG of one configured model."""

    @dag(dag_id=f"rankstream_{model}", schedule=spec.get("schedule", "@hourly"),
         start_date=datetime(2026, 1, 1), catchup=False, max_active_runs=1,
         default_args=DEFAULT_ARGS, tags=["rankstream", spec.get("algorithm", "?")],
         doc_md=f"Retrain rankstream model `{model}` ({spec.get('algorithm')}) from `{CONFIG}`.")
    def retrain():
        @task
        def ingest() -> dict:
            from pipeline.training.airflow_tasks import ingest_step

            return ingest_step(CONFIG, model)

        @task
        def build_dataset(ingested: dict) -> dict:
            from pipeline.training.airflow_tasks import dataset_step

            return dataset_step(CONFIG, model)

        @task
        def train(dataset: dict) -> dict:
            from pipeline.training.airflow_tasks import train_step

            return train_step(CONFIG, model, dataset["run_dir"])

        @task
        def evaluate_and_gate(trained: dict) -> dict:
            from pipeline.training.airflow_tasks import gate_step

            return gate_step(CONFIG, model, trained["run_dir"])

        @task
        def publish(decision: dict) -> dict:
            from pipeline.training.airflow_tasks import publish_step

            return publish_step(CONFIG, model, decision["run_dir"])

        @task
        def prune(published: dict) -> dict:
            from pipeline.training.airflow_tasks import prune_step

            return prune_step(CONFIG, model)

        prune(publish(evaluate_and_gate(train(build_dataset(ingest())))))

    return retrain()


for _model, _spec in _model_specs(CONFIG).items():
    if is_valid_name(_model):
        globals()[f"rankstream_{_model}"] = build_dag(_model, _spec)
    else:  # one bad table must not take every other model's DAG down with it
        logging.getLogger(__name__).error(
            "%s: model name %r is not valid (1-100 letters, digits, '_', '.' or '-'); its DAG "
            "is not built", CONFIG, _model)
