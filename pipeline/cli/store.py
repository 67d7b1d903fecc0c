"""``rankstream store``: inspect the event store. ``stats`` prints events, segments, bytes and
time range per kind, and where each partition resumes; ``dead-letters`` lists or exports the
dead letters (JSON lines, raw bytes in base64)."""

from __future__ import annotations

import json
from collections import Counter
from datetime import datetime, timezone

from pipeline.cli._settings_args import add_settings_arguments, load_settings


def add_arguments(parser):
    parser.add_argument("action", choices=["stats", "dead-letters"])
    parser.add_argument("--json", action="store_true", help="stats as JSON")
    parser.add_argument("--topic", help="dead letters of this source topic only")
    parser.add_argument("--export", metavar="JSONL", help="write the dead letters to this file")
    add_settings_arguments(parser, kafka=False)


def run(args) -> int:
    from pipeline.ingest.store import EventStore

    settings = load_settings(args)
    store = EventStore.from_settings(settings)
    if args.action == "dead-letters":
        return _dead_letters(store, args)
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
        print(f"\n{stats['unfinished_files']} files of unfinished flushes (removed on the next "
              "ingest of their partition)")
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


def _iso(ms: int) -> str:
    return datetime.fromtimestamp(ms / 1000, tz=timezone.utc).isoformat(timespec="seconds")
