"""``rankstream lease MODEL``: who holds the model's retrain lease and for how long more
(:mod:`pipeline.serving.lease`); ``--revoke`` takes it away, so that run's publish flip is
refused (exit status 4 of its ``train``) and the next run can start."""

from __future__ import annotations

from pipeline.cli._redis import add_redis_arguments, fail, redis_client


def add_arguments(parser) -> None:
    parser.add_argument("model")
    parser.add_argument("--revoke", action="store_true",
                        help="take the lease from its holder (its publish will be refused)")
    add_redis_arguments(parser)


def run(args) -> int:
    import redis

    from pipeline.serving.layout import ModelKeys
    from pipeline.serving.lease import revoke

    try:
        with redis_client(args) as (settings, client):
            keys = ModelKeys(settings.namespace, args.model)
            if args.revoke:
                held = revoke(client, settings.namespace, args.model)
                print(f"revoked: {held}" if held else f"model {args.model!r}: no lease held")
                return 0
            held, ttl = client.get(keys.lease), client.pttl(keys.lease)
    except (ValueError, OSError, redis.RedisError) as err:
        return fail("lease", err)
    if held is None:
        print(f"model {args.model!r}: no lease held")
    else:
        token, _, holder = held.decode(errors="replace").partition(" ")
        holder = holder.split("\t", 1)[0]     # what follows the tab is for machines
        print(f"model {args.model!r}: token {token}, held by {holder}, {ttl / 1000:.1f} s left "
              "unless renewed")
    return 0
