"""``rankstream rollback MODEL [--to VERSION]``: flip a model's current version back."""

from __future__ import annotations

from pipeline.commands._redis import add_redis_arguments, fail, redis_session


def add_arguments(parser) -> None:
    parser.add_argument("model", help="model name")
    parser.add_argument("--to", type=int, dest="version", help="kept version to make current "
                        "(default: the one published before the current one)")
    add_redis_arguments(parser)


def run(args) -> int:
    import redis

    from pipeline.model_versions import read_current, rollback
    from pipeline.redis_client import client_from_url
    from pipeline.redis_layout import ModelKeys

    try:
        with redis_session(args) as (settings, url):
            client = client_from_url(url, timeout=10.0)
            before = read_current(client, ModelKeys(settings.namespace, args.model))
            now = rollback(args.model, client, args.version, namespace=settings.namespace)
            client.close()
    except (LookupError, ValueError, OSError, RuntimeError, redis.RedisError) as err:
        return fail("rollback", err)
    print(f"{settings.namespace}/{args.model}: current version {before[0] if before else '-'}"
          f" -> {now}")
    return 0
