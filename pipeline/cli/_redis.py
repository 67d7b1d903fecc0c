"""Options and connection handling shared by the Redis subcommands (publish, recommend,
versions, rollback): ``--redis-url``, ``--namespace``, ``--home``, ``--config``; with no URL
configured anywhere, a private embedded Redis keeps its data in ``HOME/redis``."""

from __future__ import annotations

import sys
from contextlib import contextmanager


def add_redis_arguments(parser, kafka: bool = False) -> None:
    """Add the shared connection options to a subcommand's parser (``kafka``: it reads Kafka
    too, so it takes ``--bootstrap`` as ingest does)."""
    group = parser.add_argument_group("redis")
    if kafka:
        group.add_argument("--bootstrap", dest="kafka_bootstrap",
                           help="Kafka bootstrap servers, host:port[,host:port] (default: "
                                "RANKSTREAM_KAFKA_BOOTSTRAP)")
    group.add_argument("--redis-url", help="redis://[:password@]host:port/db, rediss:// for TLS, "
                       "unix:///path.sock (default: RANKSTREAM_REDIS_URL, else an embedded "
                       "server with its data in HOME/redis)")
    group.add_argument("--namespace", help="key namespace (default: RANKSTREAM_NAMESPACE or "
                       "'rankstream')")
    group.add_argument("--home", help="working directory (default: RANKSTREAM_HOME or "
                       "~/.local/share/rankstream)")
    group.add_argument("--store", help="where the store, runs and checkpoints live, if not in "
                                       "HOME: a directory or s3://bucket/prefix")
    group.add_argument("--config", help="TOML settings file")


def settings_of(args):
    """The settings for the parsed ``args`` (flags over environment over TOML file)."""
    from pipeline.settings import Settings

    return Settings.load({"redis_url": args.redis_url, "namespace": args.namespace,
                          "home": args.home, "store": getattr(args, "store", None),
                          "config": args.config,
                          "kafka_bootstrap": getattr(args, "kafka_bootstrap", None)})


@contextmanager
def redis_session(args):
    """Yield ``(settings, url)`` for the parsed ``args``; starts and stops the embedded
    server when no URL is configured."""
    from pipeline.serving.embedded_redis import redis_url_for

    settings = settings_of(args)
    if not settings.redis_url:
        print(f"(no Redis URL configured: using an embedded redis-server with its data in "
              f"{settings.home}/redis)", file=sys.stderr)
    with redis_url_for(settings) as url:
        yield settings, url


@contextmanager
def redis_client(args, *, timeout: float = 10.0, retries: int = 3):
    """Yield ``(settings, client)``: a redis-py client for the parsed ``args`` (see
    :func:`redis_session`), closed on every path out of the block."""
    from pipeline.serving.redis_client import client_from_url

    with redis_session(args) as (settings, url):
        client = client_from_url(url, timeout=timeout, retries=retries)
        try:
            yield settings, client
        finally:
            client.close()


def model_config(settings):
    """The TOML file holding the model configs, or a ``ValueError`` saying how to give one."""
    if settings.config is None:
        raise ValueError("no model config: pass --config FILE.toml or set RANKSTREAM_CONFIG "
                         "(see dags/models.toml)")
    return settings.config


def fail(command: str, err: Exception) -> int:
    """Print a one-line error for the user and return exit status 1."""
    print(f"rankstream {command}: {err}", file=sys.stderr)
    return 1
