"""What the Airflow tasks of ``dags/rankstream_retrain.py`` call (imported inside the tasks).

Kafka and Redis come from the Connections ``rankstream_kafka`` (host, port; ``extra`` holds
kafka-python security settings such as ``security_protocol`` or ``sasl_mechanism``) and
``rankstream_redis`` (a redis URL: host, port, password, schema = db; ``extra.ssl`` true for TLS).
A missing connection falls back to the environment (``RANKSTREAM_KAFKA_BOOTSTRAP``,
``RANKSTREAM_REDIS_URL``). Everything returned is a small JSON-able dict for XCom.
"""

from __future__ import annotations

from dataclasses import replace
from urllib.parse import quote

from pipeline.settings import Settings
from pipeline.training import remote, retrain

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


def _locked(config: str, model: str, step, run_dir: str | None = None):
    """Run ``step(ctx)`` holding the model's lock; Redis is needed only by steps that ask."""
    from pipeline.training.lock import model_lock

    s = settings()
    ctx = retrain.RunContext.of(config, model, s, s.redis_url, run_dir)
    with model_lock(s, model, wait=LOCK_WAIT, redis_url=s.redis_url) as lease:
        summary = step(replace(ctx, fence=lease and lease.token))
        run_dir = summary.get("run_dir") or ctx.run_dir
        if run_dir:     # the next task may run on another host: hand it a URL
            url = remote.push_run(s, run_dir)
            if summary.get("run_dir"):
                summary["run_dir"] = url
        return summary


def _skip_unless_run(summary: dict) -> dict:
    if summary.get("run_dir") is None or summary.get("decision") == retrain.Decision.NO_DATA:
        from airflow.sdk.exceptions import AirflowSkipException

        retrain.record_outcome(settings(), summary["model"], summary, 0.0)

        raise AirflowSkipException(f"{summary['model']}: {summary['decision']} "
                                   f"({summary.get('reason', 'no events in the window')})")
    return summary


def ingest_step(config: str, model: str) -> dict:
    return retrain.ingest_step(retrain.RunContext.of(config, model, settings()))


def dataset_step(config: str, model: str) -> dict:
    def step(ctx):
        summary = retrain.dataset_step(ctx)
        if summary["decision"] == retrain.Decision.UNCHANGED:   # Redis may have lost it
            summary["served"] = retrain.ensure_served(_with_redis(ctx), summary["checkpoint"])
        return summary

    return _skip_unless_run(_locked(config, model, step))


def train_step(config: str, model: str, run_dir: str) -> dict:
    return _locked(config, model, retrain.train_step, run_dir)


def gate_step(config: str, model: str, run_dir: str) -> dict:
    return _locked(config, model, lambda ctx: retrain.gate_step(_with_redis(ctx)), run_dir)


def publish_step(config: str, model: str, run_dir: str) -> dict:
    def step(ctx):
        from pipeline.training.report import report_step

        summary = retrain.publish_step(_with_redis(ctx))
        summary["report"] = report_step(ctx)["report"]
        trained = retrain.read_json(ctx.run_dir / "train.json") or {}
        decision = (retrain.Decision.PUBLISHED if summary["published"] else
                    retrain.Decision.FENCED if summary.get("fenced") else
                    retrain.Decision.REJECTED)
        retrain.record_outcome(ctx.settings, model, {**summary, "decision": decision},
                               float(trained.get("fit_seconds", 0.0)))
        return summary

    return _locked(config, model, step, run_dir)


def prune_step(config: str, model: str) -> dict:
    return _locked(config, model, retrain.prune_step)


def _with_redis(ctx: retrain.RunContext) -> retrain.RunContext:
    if not ctx.redis_url:
        raise ValueError(f"no Redis configured: define the Airflow Connection {REDIS_CONN!r} "
                         "(AIRFLOW_CONN_RANKSTREAM_REDIS) or RANKSTREAM_REDIS_URL")
    return ctx
