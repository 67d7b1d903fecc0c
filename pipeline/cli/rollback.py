"""``rankstream rollback MODEL [--to VERSION]``: flip a model's current version back."""

from __future__ import annotations

from pipeline.cli._redis import add_redis_arguments, fail, redis_client


def add_arguments(parser) -> None:
    parser.add_argument("model", help="model name")
    parser.add_argument("--to", type=int, dest="version", help="kept version to make current "
                        "(default: the one published before the current one)")
    add_redis_arguments(parser)


def run(args) -> int:
    import redis

    from pipeline.serving.layout import ModelKeys
    from pipeline.serving.versions import read_current, rollback

    try:
        with redis_client(args) as (settings, client):
            before = read_current(client, ModelKeys(settings.namespace, args.model))
            now = rollback(args.model, client, args.version, namespace=settings.namespace)
    except (LookupError, ValueError, OSError, RuntimeError, redis.RedisError) as err:
        return fail("rollback", err)
    print(f"{settings.namespace}/{args.model}: current version {before[0] if before else '-'}"
          f" -> {now}")
    return 0
