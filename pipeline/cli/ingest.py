"""``rankstream ingest``: Kafka topics (or files) -> validated event store; bad events -> dead
letters. ``--until-end`` drains to the end offsets seen at start and exits (Airflow tasks);
without it, it follows the topics until SIGTERM or Ctrl-C."""

from __future__ import annotations

import json
import sys

from pipeline.cli._settings_args import add_settings_arguments, load_settings, no_kafka


def add_arguments(parser):
    source = parser.add_argument_group("source")
    from pipeline.ingest.events import KIND_NAMES

    source.add_argument("--topic", action="append", dest="topics", metavar="TOPIC",
                        help="topic to consume (repeatable; default: rankstream.<kind> for "
                             f"--kind, else the topics of all {len(KIND_NAMES)} kinds: "
                             f"{', '.join(KIND_NAMES)})")
    source.add_argument("--kind", help="kind of events that carry no 'kind' field (SVMlight "
                                       "lines without qid: outcome or ordinal)")
    source.add_argument("--files", nargs="+", metavar="FILE",
                        help="ingest files instead of Kafka (JSON lines, CSV, Parquet, u.data, "
                             "SVMlight/LIBSVM/LETOR), into the store, local or s3://")
    source.add_argument("--format", dest="fmt",
                        choices=["jsonl", "csv", "parquet", "movielens", "svmlight"],
                        help="file format (default: from the file name; a name that does not "
                             "say is read as svmlight if its first line is one)")
    source.add_argument("--columns", metavar="FIELD=COLUMN,...",
                        help="CSV/Parquet: the column read as each event field, e.g. "
                             "user=userId,item=movieId,rating=rating,ts=timestamp (MovieLens's "
                             "ratings.csv header needs none)")
    source.add_argument("--time-unit", choices=["s", "ms", "us", "ns", "auto"],
                        help="CSV/Parquet: unit of a numeric ts, checked against the values "
                             "(default: auto with --columns, else ms)")
    run_mode = parser.add_argument_group("consumer")
    run_mode.add_argument("--until-end", action="store_true",
                          help="drain to the end offsets seen at start, then exit")
    run_mode.add_argument("--group", default="rankstream-ingest", help="consumer group")
    run_mode.add_argument("--instance-id", help="static group membership id (KIP-345)")
    run_mode.add_argument("--flush-events", type=int, default=200_000,
                          help="flush a partition after this many events (default 200000)")
    run_mode.add_argument("--flush-interval", type=float, default=5.0,
                          help="... or this many seconds (default 5)")
    run_mode.add_argument("--max-poll-records", type=int, default=20_000)
    run_mode.add_argument("--max-message-bytes", type=int, default=1 << 20)
    run_mode.add_argument("--timeout", type=float, help="stop after this many seconds")
    run_mode.add_argument("--no-check-crcs", dest="check_crcs", action="store_false",
                          help="skip kafka-python's record CRC checks (faster)")
    parser.add_argument("--json", action="store_true", help="print the summary as JSON")
    add_settings_arguments(parser)


def run(args) -> int:
    from pipeline.ingest.events import KIND_NAMES, default_topic
    from pipeline.ingest.files import ingest_files
    from pipeline.ingest.kafka import ingest_kafka

    settings = load_settings(args)
    if args.files:
        try:
            summary = ingest_files(args.files, args.kind, settings=settings, fmt=args.fmt,
                                   columns=args.columns, time_unit=args.time_unit,
                                   progress=args.progress,
                                   max_message_bytes=args.max_message_bytes)
        except (ValueError, OSError) as err:
            print(f"rankstream ingest: {err}", file=sys.stderr)
            return 2
    else:
        if no_kafka(settings, "ingest", "; use --files for embedded mode"):
            return 2
        from pipeline.ingest.kafka import check_kafka_reachable

        try:
            check_kafka_reachable(settings.kafka_bootstrap)
        except ValueError as err:
            print(f"rankstream ingest: {err}", file=sys.stderr)
            return 2
        if args.topics:
            topics = dict.fromkeys(args.topics, args.kind)
        elif args.kind:
            topics = {default_topic(args.kind): args.kind}
        else:
            topics = {default_topic(kind): kind for kind in KIND_NAMES}
        summary = ingest_kafka(
            topics, settings=settings, group_id=args.group, until_end=args.until_end,
            flush_events=args.flush_events, flush_interval=args.flush_interval,
            max_poll_records=args.max_poll_records, max_message_bytes=args.max_message_bytes,
            instance_id=args.instance_id, timeout=args.timeout, check_crcs=args.check_crcs,
            progress=args.progress)
    if args.json:
        print(json.dumps({"messages": summary.messages, "events": dict(summary.events),
                          "dead_letters": dict(summary.dead_letters),
                          "segments": summary.segments, "seconds": round(summary.seconds, 3),
                          "stopped": summary.stopped, "recreated": summary.recreated,
                          "already_stored": summary.already_stored,
                          "removed": summary.removed, "warnings": summary.warnings}))
    else:
        print(summary)
    return 0
