"""``rankstream versions MODEL``: the kept published versions of a model."""

from __future__ import annotations

import json

from pipeline.cli._redis import add_redis_arguments, fail, redis_client


def add_arguments(parser) -> None:
    parser.add_argument("model", help="model name")
    parser.add_argument("--json", action="store_true", help="print JSON lines")
    add_redis_arguments(parser)


def run(args) -> int:
    from dataclasses import asdict

    import redis

    from pipeline.serving.versions import versions

    try:
        with redis_client(args) as (settings, client):
            infos = versions(args.model, client, namespace=settings.namespace)
    except (LookupError, ValueError, OSError, RuntimeError, redis.RedisError) as err:
        return fail("versions", err)
    if args.json:
        for info in infos:
            print(json.dumps(asdict(info)))
        return 0
    print(f"{'':2}{'version':>7}  {'status':<9} {'kind':<17} {'serves':<16} "
          f"{'algorithm':<14} {'published_at':<26} metrics")
    for v in infos:
        mark = "* " if v.current else "  "
        print(f"{mark}{v.version:>7}  {v.status:<9} {v.kind:<17} {v.served_as:<16} "
              f"{v.algorithm or '-':<14} {v.published_at:<26} {json.dumps(v.metrics)}")
    return 0
