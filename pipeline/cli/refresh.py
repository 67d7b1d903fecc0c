"""``rankstream refresh [MODEL ...]``: keep each model's users' answers fresh between retrains
(:mod:`pipeline.refresh`): one consumer group per model on its Kafka topics; runs until SIGTERM
or Ctrl-C. Needs Kafka and a Redis URL (an embedded Redis would be a private one nobody reads)."""

from __future__ import annotations

import logging
import signal
import sys
import threading

from pipeline.cli._redis import add_redis_arguments, fail, model_config, settings_of


def add_arguments(parser) -> None:
    parser.add_argument("models", nargs="*", metavar="MODEL",
                        help="models to refresh (default: every configured model)")
    parser.add_argument("--batch-ms", type=int, default=200,
                        help="the longest a touched user waits for a recompute while a "
                             "backlog drains, and how often offsets are committed "
                             "(default 200 ms)")
    add_redis_arguments(parser, kafka=True)


def refreshers(settings, models: dict, names: list[str], url: str) -> list:
    """A :class:`~pipeline.refresh.refresher.Refresher` per named model."""
    from pipeline.ingest.open_store import open_store
    from pipeline.refresh.refresher import Refresher
    from pipeline.serving.lookup import TopK
    from pipeline.serving.redis_client import as_client

    store = open_store(settings)
    return [Refresher(name, models[name], settings,
                      TopK(as_client(url), namespace=settings.namespace, timeout=5.0),
                      store, redis_url=url) for name in names]


def run(args) -> int:
    from threadpoolctl import threadpool_limits

    from pipeline.refresh.kafka_source import KafkaRefresh
    from pipeline.training.config import load_models
    from solvers.fold_in import warm_up as load_fold_in

    logging.basicConfig(level=logging.INFO, format="%(asctime)s refresh %(message)s")
    # kafka-python says every metadata refresh at INFO (103 lines in 8 minutes of a quiet
    # refresher): its warnings and errors are what an operator acts on
    logging.getLogger("kafka").setLevel(logging.WARNING)
    # one user's fold-in is a few small products and solves: BLAS threads would only spin
    # against each other (a third of the time at 2 threads on a busy machine)
    threadpool_limits(1)
    load_fold_in()     # compiled or loaded now, not on the first event (6 s on a fresh clone)
    try:
        settings = settings_of(args)
        models = load_models(model_config(settings))
        names = args.models or sorted(models)
        unknown = [n for n in names if n not in models]
        if unknown:
            raise ValueError(f"model {unknown[0]!r} is not configured; configured: "
                             f"{sorted(models)}")
        if not settings.kafka_bootstrap or not settings.redis_url:
            raise ValueError("refresh reads Kafka and writes the served Redis: give --bootstrap "
                             "and --redis-url (or set RANKSTREAM_KAFKA_BOOTSTRAP and "
                             "RANKSTREAM_REDIS_URL)")
        if not 10 <= args.batch_ms <= 60_000:
            raise ValueError(f"--batch-ms is {args.batch_ms}, expected 10..60000")
        stop = threading.Event()
        loops = [KafkaRefresh(r, settings, batch_ms=args.batch_ms, stop=stop)
                 for r in refreshers(settings, models, names, settings.redis_url)]
    except (ValueError, KeyError, OSError) as err:
        return fail("refresh", err)
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    threads = [threading.Thread(target=loop.run, name=f"refresh-{loop.refresher.model}",
                                daemon=True) for loop in loops]
    for t in threads:
        t.start()
    every = "every configured model: " if not args.models else ""
    print(f"rankstream refresh: {', '.join(names)} ({every}each folds users' new events in "
          "where its served shape can, and is republished from its last checkpoint if Redis "
          "loses it; Ctrl-C stops)", file=sys.stderr)
    while any(t.is_alive() for t in threads):
        for t in threads:
            t.join(0.5)
    return 0
