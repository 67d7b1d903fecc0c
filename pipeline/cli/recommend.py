"""``rankstream recommend MODEL [USER] -k 10``: top-K lookup from Redis; with
``--exclude``, filtered; ``--similar ITEM``: the items like ITEM; ``--items A,B``: a new user
folded in from the items they met; ``--explain ITEM``: why USER gets ITEM (the served score
split by their history). The same lookups as the HTTP API's and the Python client's."""

from __future__ import annotations

import json

from pipeline.cli._redis import add_redis_arguments, fail, redis_session


def add_arguments(parser) -> None:
    parser.add_argument("model", help="model name")
    parser.add_argument("user", nargs="?", help="user or query id (omit for the list everyone "
                        "gets: a global list, or a per-user model's fallback list)")
    parser.add_argument("-k", type=int, default=10, help="number of items (default 10)")
    parser.add_argument("--exclude", type=_ids, default=None, metavar="ITEM,...",
                        help="items left out of the answer")
    asks = parser.add_mutually_exclusive_group()
    asks.add_argument("--similar", metavar="ITEM", help="the items most like ITEM instead")
    asks.add_argument("--items", type=_ids, metavar="ITEM,...",
                      help="a new user's answer, folded in from the items they met")
    asks.add_argument("--explain", metavar="ITEM", help="why USER gets ITEM: the score split "
                      "into one term per item they met")
    parser.add_argument("--json", action="store_true", help="print the answer as JSON")
    add_redis_arguments(parser)


def _ids(text: str) -> list[str]:
    """``a,b,c`` as item ids (decimal ids match a version's integer ids)."""
    return [x.strip() for x in text.split(",") if x.strip()]


def _ask(topk, args):
    """The lookup the flags name."""
    if args.similar is not None:
        return topk.similar(args.model, args.similar, k=args.k, exclude=args.exclude)
    if args.items is not None:
        return topk.fold_in(args.model, args.items, k=args.k, exclude=args.exclude)
    if args.explain is not None:
        if args.user is None:
            raise ValueError("--explain ITEM needs the USER whose score it splits")
        return topk.explain(args.model, args.user, args.explain, k=args.k)
    return topk.recommend(args.model, args.user, k=args.k, exclude=args.exclude)


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
                    rec = _ask(topk, args)
                    served = topk.served_version(args.model)
                except UnknownModelError:
                    return fail("recommend", LookupError(unknown_model_reason(
                        args.model, _configured(settings))))
    except (LookupError, ValueError, TypeError, RuntimeError, OSError,
            redis.RedisError) as err:
        return fail("recommend", err)
    if args.explain is not None:
        return _explained(rec, args.json)
    if args.json:
        print(json.dumps({"model": rec.model, "user": rec.user, "version": rec.version,
                          "source": rec.source, "stale": rec.stale,
                          "items": [[i, s] for i, s in rec.items]}))
        return 0
    # a search model's lists are per query, not per user
    key = "query" if served is not None and served.kind == "query_docs" else "user"
    who = (f"items like {rec.user!r}" if args.similar is not None else
           f"a new user who met {', '.join(args.items)}" if args.items is not None else
           f"{key} {rec.user!r}" if rec.user is not None else "global list")
    print(f"{rec.model} version {rec.version}, {who}: {rec.source}")
    for rank, (item, score) in enumerate(rec.items, 1):
        print(f"{rank:>4}  {item!s:<24} {score:.6g}")
    return 0


def _explained(e, as_json: bool) -> int:
    """An explanation: its score, then one line per listed term, the rest, bias, residual."""
    if as_json:
        print(json.dumps(e.to_dict(), default=str))
        return 0
    score = "no score" if e.score is None else f"score {e.score:.6g}"
    print(f"{e.model} version {e.version}, user {e.user!r}, item {e.item!r}: {score}"
          + (f" ({e.method}; {e.factor} factor)" if e.method else ""))
    if e.note:
        print(f"  {e.note}")
    for c in e.contributions:
        what = c.get("item", f"{c.get('winner')!s} over {c.get('loser')!s}")
        share = "" if c.get("share") is None else f"  {c['share']:.1%}"
        print(f"  {what!s:<24} {c['term']:+.6g}{share}")
    if e.n_terms > len(e.contributions):
        print(f"  {e.n_terms - len(e.contributions)} more terms {e.rest:+.6g}")
    if e.contributions:
        print(f"  bias {e.bias:+.6g}, residual {e.residual:+.6g}")
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
