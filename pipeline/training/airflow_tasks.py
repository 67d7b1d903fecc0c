"""What the Airflow tasks of ``dags/rankstream_retrain.py`` call (imported inside the tasks).

Kafka and Redis come from the Connections ``rankstream_kafka`` (host, port; ``extra`` holds
kafka-python security settings such as ``security_protocol`` or ``sasl_mechanism``) and
``rankstream_redis`` (a redis URL: host, port, password, schema = db; ``extra.ssl`` true for TLS).
A missing connection falls back to the environment (``RANKSTREAM_KAFKA_BOOTSTRAP``,
``RANKSTREAM_REDIS_URL``). Everything returned is a small JSON-able dict for XCom.
"""

from __future__ import annotations

from urllib.parse import quote

from pipeline.settings import Settings
from pipeline.training import retrain
from pipeline.training.config import load_models

KAFKA_CONN, REDIS_CONN = "rankstream_kafka", "rankstream_redis"


def _connection(conn_id: str):
    from airflow.sdk import Connection

    try:
        return Connection.get(conn_id)
    except Exception:  # not defined: AirflowNotFoundException and friends
        return None


def redis_url_of(conn) -> str:
    """``redis://[[user]:password@]host:port/db`` (``rediss://`` when ``extra.ssl``) of a
    Connection; user and password are percent-encoded (a password may hold ``@ # ? /``).

    Examples
    --------
    >>> from types import SimpleNamespace as C
    >>> redis_url_of(C(login=None, password="p@ss#w?rd/1", host="h", port=6380, schema=2,
    ...                extra_dejson={}))
    'redis://:p%40ss%23w%3Frd%2F1@h:6380/2'
    """
    scheme = "rediss" if str(conn.extra_dejson.get("ssl", "")).lower() in ("1", "true") \
        else "redis"
    auth = ""
    if conn.password:
        auth = f"{quote(conn.login or '', safe='')}:{quote(conn.password, safe='')}@"
    return f"{scheme}://{auth}{conn.host or '127.0.0.1'}:{conn.port or 6379}/{conn.schema or 0}"


def settings() -> Settings:
    """Settings from the environment, overridden by the Airflow Connections when defined."""
    overrides = {}
    kafka = _connection(KAFKA_CONN)
    if kafka is not None:
        overrides["kafka_bootstrap"] = f"{kafka.host}:{kafka.port or 9092}"
        overrides["kafka_security"] = dict(kafka.extra_dejson)
    redis = _connection(REDIS_CONN)
    if redis is not None:
        overrides["redis_url"] = redis_url_of(redis)
    return Settings.load(overrides)


# Every step holds the model's retrain lock, so a CLI `rankstream train` of the same model and
# a DAG run never interleave their steps; a step waits for the other run up to LOCK_WAIT.
LOCK_WAIT = 3600.0


def _locked(model: str, step):
    from pipeline.training.lock import model_lock

    s = settings()
    with model_lock(s, model, wait=LOCK_WAIT):
        return step(s)


def _skip_unless_run(summary: dict) -> dict:
    if summary.get("run_dir") is None or summary.get("decision") == "no_data":
        from airflow.sdk.exceptions import AirflowSkipException

        raise AirflowSkipException(f"{summary['model']}: {summary['decision']} "
                                   f"({summary.get('reason', 'no events in the window')})")
    return summary


def ingest_step(config: str, model: str) -> dict:
    return retrain.ingest_step(settings(), load_models(config)[model].kinds)


def dataset_step(config: str, model: str) -> dict:
    def step(s):
        summary = retrain.dataset_step(config, model, s)
        if summary["decision"] == "unchanged":   # Redis may have lost it meanwhile
            summary["served"] = retrain.ensure_served(config, model, summary["checkpoint"], s,
                                                      _redis_url(s))
        return summary

    return _skip_unless_run(_locked(model, step))


def train_step(config: str, model: str, run_dir: str) -> dict:
    return _locked(model, lambda s: retrain.train_step(config, model, run_dir))


def gate_step(config: str, model: str, run_dir: str) -> dict:
    return _locked(model, lambda s: retrain.gate_step(config, model, run_dir, s, _redis_url(s)))


def publish_step(config: str, model: str, run_dir: str) -> dict:
    return _locked(model, lambda s: retrain.publish_step(config, model, run_dir, s,
                                                         _redis_url(s)))


def prune_step(config: str, model: str) -> dict:
    return _locked(model, lambda s: retrain.prune_step(config, model, s))


def _redis_url(s: Settings) -> str:
    if not s.redis_url:
        raise ValueError(f"no Redis configured: define the Airflow Connection {REDIS_CONN!r} "
                         "(AIRFLOW_CONN_RANKSTREAM_REDIS) or RANKSTREAM_REDIS_URL")
    return s.redis_url
