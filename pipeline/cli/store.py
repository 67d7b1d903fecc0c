"""``rankstream store``: inspect the event store. ``stats`` prints events, segments, bytes and
time range per kind, and where each partition resumes; ``dead-letters`` lists or exports the
dead letters (JSON lines, raw bytes in base64); ``copy --to LOCATION`` copies the store's
flushes, offsets and all, into another store (a directory or ``s3://bucket/prefix``);
``create-bucket`` creates the bucket of an ``s3://`` store (``--store`` or
``RANKSTREAM_STORE``) if it does not exist."""

from __future__ import annotations

import json
import sys
from collections import Counter
from datetime import datetime, timezone

from pipeline.cli._settings_args import add_settings_arguments, load_settings


def add_arguments(parser):
    parser.add_argument("action", choices=["stats", "dead-letters", "copy", "create-bucket"])
    parser.add_argument("--json", action="store_true", help="stats as JSON")
    parser.add_argument("--topic", help="dead letters of this source topic only")
    parser.add_argument("--export", metavar="JSONL", help="write the dead letters to this file")
    parser.add_argument("--to", metavar="LOCATION",
                        help="copy: the target store, a directory or s3://bucket/prefix")
    add_settings_arguments(parser, kafka=False)


def run(args) -> int:
    try:
        return _run(args)
    except (ValueError, OSError) as err:
        print(f"rankstream store: {err}", file=sys.stderr)
        return 1


def _run(args) -> int:
    from pipeline.ingest.open_store import open_store

    settings = load_settings(args)
    if args.action == "create-bucket":
        return _create_bucket(settings)
    store = open_store(settings)
    if args.action == "dead-letters":
        return _dead_letters(store, args)
    if args.action == "copy":
        return _copy(store, args)
    stats = store.stats()
    if args.json:
        print(json.dumps(stats, indent=2))
        return 0
    print(f"store {store.root}  (dead letters in {store.dead_letter_root})")
    print(f"{'kind':<12} {'events':>12} {'segments':>9} {'MB':>9}  time range (UTC)")
    for kind, entry in sorted(stats["kinds"].items()):
        span = (f"{_iso(entry['min_ts'])} .. {_iso(entry['max_ts'])}"
                if entry["min_ts"] is not None else "")
        print(f"{kind:<12} {entry['events']:>12,} {entry['segments']:>9,} "
              f"{entry['bytes'] / 1e6:>9.2f}  {span}")
    print("\nnext offset per topic/partition:")
    for key, offset in stats["next_offsets"].items():
        print(f"  {key}: {offset:,}")
    if stats["unfinished_files"]:
        print(f"\n{stats['unfinished_files']} files of unfinished flushes: readers ignore them, "
              "and the next ingest of their partition removes them (on an object store, once "
              "they are an hour old)")
    return 0


def _dead_letters(store, args) -> int:
    from pipeline.ingest.dead_letters import export_jsonl

    table = store.read_dead_letters(topic=args.topic)
    if args.export:
        print(f"wrote {export_jsonl(table, args.export):,} dead letters to {args.export}")
        return 0
    reasons = Counter(table.column("reason").to_pylist())
    print(f"{table.num_rows:,} dead letters; most common reasons:")
    for reason, count in reasons.most_common(20):
        print(f"  {count:>8,}  {reason}")
    return 0


def _copy(store, args) -> int:
    from dataclasses import replace

    from pipeline.ingest.open_store import open_store
    from pipeline.ingest.store import copy_store

    if not args.to:
        raise ValueError("store copy needs --to LOCATION (a directory or s3://bucket/prefix)")
    target = open_store(replace(load_settings(args), store=args.to))
    copied, skipped = copy_store(store, target)
    print(f"copied {copied:,} flushes from {store.root} to {target.root}; {skipped:,} were "
          "there already")
    return 0


def _create_bucket(settings) -> int:
    from pipeline.storage import object_store_for

    if not settings.remote:
        raise ValueError(f"create-bucket is for an object store, and the store is the "
                         f"directory {settings.root}: pass --store s3://BUCKET/PREFIX (or set "
                         "RANKSTREAM_STORE)")
    objects = object_store_for(settings)
    where = objects.endpoint or "AWS"
    if objects.ensure_bucket():
        print(f"created bucket {objects.bucket!r} at {where}: the store {objects.url()} is "
              "ready")
    else:
        print(f"bucket {objects.bucket!r} already exists at {where}: nothing to do")
    return 0


def _iso(ms: int) -> str:
    return datetime.fromtimestamp(ms / 1000, tz=timezone.utc).isoformat(timespec="seconds")
