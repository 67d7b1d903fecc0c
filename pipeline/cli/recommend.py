"""``rankstream recommend MODEL [USER] -k 10``: top-K lookup from Redis."""

from __future__ import annotations

import json

from pipeline.cli._redis import add_redis_arguments, fail, redis_session


def add_arguments(parser) -> None:
    parser.add_argument("model", help="model name")
    parser.add_argument("user", nargs="?", help="user or query id (omit for the list everyone "
                        "gets: a global list, or a per-user model's fallback list)")
    parser.add_argument("-k", type=int, default=10, help="number of items (default 10)")
    parser.add_argument("--json", action="store_true", help="print the answer as JSON")
    add_redis_arguments(parser)


def run(args) -> int:
    import sys

    import redis

    from pipeline.serving.api_requests import check_k, unknown_model_reason
    from pipeline.serving.layout import UnknownModelError
    from pipeline.serving.lookup import TopK

    try:
        check_k(args.k)                 # the API's rule for k (1..MAX_K), before any Redis
    except ValueError as err:
        print(f"rankstream recommend: {err}", file=sys.stderr)
        return 2                        # a usage error, as argparse's
    try:
        with redis_session(args) as (settings, url):
            with TopK(url, namespace=settings.namespace, timeout=max(settings.redis_timeout,
                                                                     1.0)) as topk:
                try:
                    rec = topk.recommend(args.model, args.user, k=args.k)
                    served = topk.served_version(args.model)
                except UnknownModelError:
                    return fail("recommend", LookupError(unknown_model_reason(
                        args.model, _configured(settings))))
    except (LookupError, ValueError, TypeError, RuntimeError, OSError,
            redis.RedisError) as err:
        return fail("recommend", err)
    if args.json:
        print(json.dumps({"model": rec.model, "user": rec.user, "version": rec.version,
                          "source": rec.source, "stale": rec.stale,
                          "items": [[i, s] for i, s in rec.items]}))
        return 0
    # a search model's lists are per query, not per user
    key = "query" if served is not None and served.kind == "query_docs" else "user"
    who = f"{key} {rec.user!r}" if rec.user is not None else "global list"
    print(f"{rec.model} version {rec.version}, {who}: {rec.source}")
    for rank, (item, score) in enumerate(rec.items, 1):
        print(f"{rank:>4}  {item!s:<24} {score:.6g}")
    return 0


def _configured(settings) -> list[str]:
    """The configured model names (none when there is no readable config)."""
    if not settings.config:
        return []
    try:
        from pipeline.training.config import load_models

        return list(load_models(settings.config))
    except (ValueError, OSError):
        return []
