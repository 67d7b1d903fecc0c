"""``rankstream rekey``: copy a topic's events to a topic keyed by user
(:mod:`pipeline.ingest.rekey`), for producers that do not key events by user, so that several
refreshers of a model split users (``docs/deploy.md``)."""

from __future__ import annotations

import sys

from pipeline.cli._settings_args import add_settings_arguments, load_settings, no_kafka


def add_arguments(parser):
    parser.add_argument("topic", help="the topic whose events are not keyed by user")
    parser.add_argument("--to", dest="target",
                        help="the user-keyed topic to write (default: TOPIC.by-user; created "
                             "like TOPIC when missing)")
    parser.add_argument("--encoding", default="compact", choices=["compact", "json", "msgpack"],
                        help="compact: msgpack batches per partition (default); json/msgpack: "
                             "one message per event")
    parser.add_argument("--until-idle", type=float, metavar="SECONDS",
                        help="stop once no message came for this long (default: run until "
                             "SIGTERM or Ctrl-C)")
    add_settings_arguments(parser)


def run(args) -> int:
    import threading

    from pipeline.ingest.kafka import check_kafka_reachable
    from pipeline.ingest.kafka_group import stop_on_signals
    from pipeline.ingest.rekey import Rekeyer, target_of

    settings = load_settings(args)
    if no_kafka(settings, "rekey"):
        return 2
    if args.until_idle is not None and not args.until_idle > 0:
        print(f"rankstream rekey: --until-idle is {args.until_idle:g}; give seconds > 0",
              file=sys.stderr)
        return 2
    target = args.target or target_of(args.topic)
    stop = threading.Event()
    try:
        check_kafka_reachable(settings.kafka_bootstrap)
        with stop_on_signals(stop):
            counts = Rekeyer(args.topic, target, settings, encoding=args.encoding,
                             stop=stop).run(until_idle=args.until_idle)
    except ValueError as err:
        print(f"rankstream rekey: {err}", file=sys.stderr)
        return 2
    print(f"re-keyed {counts['events']:,} events from {counts['messages']:,} messages of "
          f"{args.topic} to {target}; {counts['passed_on']:,} passed on as they came (no user "
          "id, or not decodable: the target's readers dead-letter them)")
    return 0
