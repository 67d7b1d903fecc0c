"""Options and connection handling shared by the Redis subcommands (publish, recommend,
versions, rollback): ``--redis-url``, ``--namespace``, ``--home``, ``--config``; with no URL
configured anywhere, a private embedded Redis keeps its data in ``HOME/redis``."""

from __future__ import annotations

import sys
from contextlib import contextmanager


def add_redis_arguments(parser) -> None:
    """Add the shared connection options to a subcommand's parser."""
    group = parser.add_argument_group("redis")
    group.add_argument("--redis-url", help="redis://[:password@]host:port/db, rediss:// for TLS, "
                       "unix:///path.sock (default: RANKSTREAM_REDIS_URL, else an embedded "
                       "server with its data in HOME/redis)")
    group.add_argument("--namespace", help="key namespace (default: RANKSTREAM_NAMESPACE or "
                       "'rankstream')")
    group.add_argument("--home", help="working directory (default: RANKSTREAM_HOME or "
                       "./.rankstream)")
    group.add_argument("--config", help="TOML settings file")


@contextmanager
def redis_session(args):
    """Yield ``(settings, url)`` for the parsed ``args``; starts and stops the embedded
    server when no URL is configured."""
    from pipeline.embedded_redis import redis_url_for
    from pipeline.settings import Settings

    settings = Settings.load({"redis_url": args.redis_url, "namespace": args.namespace,
                              "home": args.home, "config": args.config})
    if not settings.redis_url:
        print(f"(no Redis URL configured: using an embedded redis-server with its data in "
              f"{settings.home}/redis)", file=sys.stderr)
    with redis_url_for(settings) as url:
        yield settings, url


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
