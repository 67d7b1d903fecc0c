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
from pipeline.training import retrain, steps
from pipeline.training.run_types import Decision, RunContext

KAFKA_CONN, REDIS_CONN = "rankstream_kafka", "rankstream_redis"
RAY_CONN = "rankstream_ray"      # host and port of the Ray head the AltSVM fits run on


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
    ray = _connection(RAY_CONN)
    if ray is not None:
        overrides["ray_address"] = f"{ray.host or '127.0.0.1'}:{ray.port or 6390}"
    return Settings.load(overrides)


# Every step holds the model's retrain lock, so a CLI `rankstream train` of the same model and
# a DAG run never interleave their steps; a step waits for the other run up to LOCK_WAIT.
LOCK_WAIT = 3600.0


def _locked(config: str, model: str, step, run_dir: str | None = None):
    """Run ``step(ctx)`` holding the model's lock and hand the next task (maybe on another
    host) the run directory's URL."""
    from pipeline.training.lock import model_lock

    s = settings()
    ctx = RunContext.of(config, model, s, s.redis_url, run_dir)
    with model_lock(s, model, wait=LOCK_WAIT, redis_url=s.redis_url) as lease:
        summary = step(replace(ctx, fence=lease and lease.token))
        local = summary.get("run_dir") or ctx.run_dir
        if local:
            url = ctx.runs.push_run(local)
            if summary.get("run_dir"):
                summary["run_dir"] = url
        return summary


def _with_redis(ctx: RunContext) -> RunContext:
    if not ctx.redis_url:
        raise ValueError(f"no Redis configured: define the Airflow Connection {REDIS_CONN!r} "
                         "(AIRFLOW_CONN_RANKSTREAM_REDIS) or RANKSTREAM_REDIS_URL")
    return ctx


def ingest_step(config: str, model: str) -> dict:
    return steps.ingest_step(RunContext.of(config, model, settings()))


def dataset_step(config: str, model: str) -> dict:
    """The dataset; a window with nothing to train ends the run here (its outcome recorded,
    the later tasks skipped)."""
    def step(ctx):
        summary = steps.dataset_step(ctx)
        if summary["decision"] == Decision.UNCHANGED:   # Redis may have lost it
            summary["served"] = steps.ensure_served(_with_redis(ctx), summary["checkpoint"])
            if summary["served"]["republished"]:
                summary.update(decision=Decision.REPUBLISHED,
                               reason=summary["served"]["reason"])
        if summary["decision"] not in (Decision.PENDING,):
            retrain.finish_run(ctx, summary)
        return summary

    summary = _locked(config, model, step)
    if summary["decision"] != Decision.PENDING:
        from airflow.sdk.exceptions import AirflowSkipException

        raise AirflowSkipException(f"{model}: {summary['decision']} "
                                   f"({summary.get('reason', 'no events in the window')})")
    return summary


def train_step(config: str, model: str, run_dir: str) -> dict:
    return _locked(config, model, steps.train_step, run_dir)


def gate_step(config: str, model: str, run_dir: str) -> dict:
    return _locked(config, model, lambda ctx: steps.gate_step(_with_redis(ctx)), run_dir)


def publish_step(config: str, model: str, run_dir: str) -> dict:
    """Publish, write the report and end the run (:func:`retrain.finish_run`)."""
    def step(ctx):
        summary = steps.publish_step(_with_redis(ctx))
        summary["report"] = steps.report_step(ctx)["report"]
        retrain.finish_run(ctx, {**summary, "decision": Decision.of_publish(summary)},
                           steps.dataset_summary(ctx.run_dir)["started_at"])
        return summary

    return _locked(config, model, step, run_dir)


def prune_step(config: str, model: str) -> dict:
    return _locked(config, model, steps.prune_step)
