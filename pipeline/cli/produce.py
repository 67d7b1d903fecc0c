"""``rankstream produce``: send events from files (JSON lines, CSV, Parquet, MovieLens u.data)
to a Kafka topic, as JSON (one event per message) or compact msgpack column batches."""

from __future__ import annotations

import sys

from pipeline.cli._settings_args import add_settings_arguments, load_settings, no_kafka


def add_arguments(parser):
    parser.add_argument("files", nargs="+", help="event files")
    parser.add_argument("--topic", help="target topic (default: rankstream.<kind>)")
    parser.add_argument("--kind", help="kind of events that carry no 'kind' field")
    parser.add_argument("--format", dest="fmt", choices=["jsonl", "csv", "parquet", "movielens"],
                        help="file format (default: from the file name)")
    parser.add_argument("--encoding", default="json", choices=["json", "msgpack", "compact"],
                        help="json: one message per event (default); compact: msgpack batches")
    add_settings_arguments(parser)


def run(args) -> int:
    from pipeline.ingest.events import default_topic
    from pipeline.ingest.producer import produce_files

    settings = load_settings(args)
    if no_kafka(settings, "produce"):
        return 2
    kind = args.kind or ("rating" if args.fmt == "movielens" else None)
    topic = args.topic or (default_topic(kind) if kind else None)
    if topic is None:
        print("rankstream produce: give --topic or --kind", file=sys.stderr)
        return 2
    from pipeline.ingest.files import check_source
    from pipeline.ingest.kafka import check_kafka_reachable

    try:
        for path in args.files:
            check_source(path, args.fmt, kind)
        check_kafka_reachable(settings.kafka_bootstrap)
    except ValueError as err:
        print(f"rankstream produce: {err}", file=sys.stderr)
        return 2
    result = produce_files(args.files, topic, bootstrap=settings.kafka_bootstrap, kind=kind,
                           fmt=args.fmt, encoding=args.encoding,
                           security=settings.kafka_security, progress=args.progress)
    rate = result["events"] / result["seconds"] if result["seconds"] else 0.0
    print(f"sent {result['events']:,} events in {result['messages']:,} messages to {topic} "
          f"in {result['seconds']:.1f} s ({rate:,.0f} events/s)")
    return 0
