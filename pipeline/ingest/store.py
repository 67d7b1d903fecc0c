"""The event store: append-only Parquet segments per topic partition, one schema per kind.

Layout (hive-style, so ``pyarrow.dataset``, DuckDB or Spark can read it as it is)::

    {store_dir}/kind=rating/topic=ratings/partition=0/00000000000000000000-00000000000000004999-of2.parquet
    {dead_letter_dir}/topic=ratings/partition=0/00000000000000000000-00000000000000004999-of2.parquet

A file name carries the first and last offset of the messages it was written from and the size
of its **group**: one flush of a topic partition writes one segment per kind present plus one
dead-letter segment if there were bad events, all with the same offsets (``-of2`` above: a
rating segment and a dead-letter segment). Each file is written to a temporary name, fsynced and
renamed, then the directories are fsynced. A group whose files are not all there is a crash
leftover: readers ignore it and the next writer deletes it. So the store only ever shows whole
flushes, and ``next_offsets()`` (one past the last offset of the last whole group) is where a
restarted consumer resumes: each message's events are in the store exactly once, whenever the
process was killed. Writers hold an ``flock`` per topic partition and refuse a group that
overlaps what is stored (a consumer that lost its partition without noticing cannot write it
twice).

File sources use the same store under one synthetic topic, ``~files`` (a name no Kafka topic
can have), partition 0, whose offsets are append positions (see :mod:`pipeline.ingest.ledger`).

Examples
--------
>>> import tempfile, pyarrow as pa
>>> from pipeline.ingest.store import EventStore
>>> from pipeline.ingest.events import schema
>>> store = EventStore(tempfile.mkdtemp())
>>> rows = pa.Table.from_pylist([{"event_id": "e1", "ts": 1000, "offset": 0, "user": "u1",
...                               "item": "i1", "rating": 4.0}], schema=schema("rating"))
>>> _ = store.write("ratings", 0, first=0, last=0, tables={"rating": rows})
>>> store.next_offsets()
{('ratings', 0): 1}
>>> store.read("rating").column("user").to_pylist()
['u1']
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import re
import socket
import time
from collections import defaultdict
from collections.abc import Iterable, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as ds
import pyarrow.parquet as pq

from pipeline.ingest.dead_letters import DEAD_LETTER_KIND, DEAD_LETTER_SCHEMA
from pipeline.ingest.events import KINDS, schema
from solvers.persist import fsync_dir, fsync_file, makedirs_durable

FORMAT_VERSION = 1
_SEGMENT_NAME = re.compile(r"^(\d{20})-(\d{20})-of(\d+)\.parquet$")
TopicPartition = tuple[str, int]


class OverlapError(RuntimeError):
    """A segment group would overlap offsets already in the store."""


@dataclass(frozen=True)
class Segment:
    """One segment file: ``kind`` is an event kind or ``"dead_letter"``."""

    path: Path
    kind: str
    topic: str
    partition: int
    first: int
    last: int
    group_size: int

    @property
    def group(self) -> tuple[str, int, int, int]:
        return self.topic, self.partition, self.first, self.last


GENERATION_MARK = "~g"   # TOPIC~g2: the events of TOPIC after it was deleted and re-created


def _generation_number(topic: str, name: str) -> int:
    """1 for ``topic`` itself, N for ``topic~gN``, 0 for any other name.

    >>> [_generation_number("r", n) for n in ("r", "r~g3", "rx", "r~gx")]
    [1, 3, 0, 0]
    """
    if name == topic:
        return 1
    rest = name[len(topic):] if name.startswith(topic) else ""
    digits = rest[len(GENERATION_MARK):]
    return int(digits) if rest.startswith(GENERATION_MARK) and digits.isdigit() else 0


def legacy_file_topic(path: str | Path) -> str:
    """The topic under which stores written before the file ledger kept a file (one per
    absolute path, record numbers as offsets); still read, never written.

    >>> legacy_file_topic("/data/u.data").startswith("file.u.data.")
    True
    """
    resolved = str(Path(path).resolve())
    name = re.sub(r"[^A-Za-z0-9._-]", "_", Path(resolved).name)[:80]
    return f"file.{name}.{hashlib.sha256(resolved.encode()).hexdigest()[:12]}"


class EventStore:
    """Parquet segments under ``root`` (events) and ``dead_letter_root`` (dead letters).

    Parameters
    ----------
    root : path
        The store directory (``Settings.store_dir``).
    dead_letter_root : path, optional
        The dead-letter directory (``Settings.dead_letter_dir``); default ``root/../dead-letter``.
    compression : str
        Parquet codec of new segments. ``"lz4"`` (default) writes about 1.4x as fast as
        ``"zstd"``, which makes files about 2.5x smaller (bench data: 5 vs 2 bytes per rating).
    """

    def __init__(self, root: str | Path, dead_letter_root: str | Path | None = None, *,
                 compression: str = "lz4"):
        self.root = Path(root)
        self.dead_letter_root = (Path(dead_letter_root) if dead_letter_root is not None
                                 else self.root.parent / "dead-letter")
        self.compression = compression
        self.writer = f"{socket.gethostname()}:{os.getpid()}"

    filesystem = None      # pyarrow's filesystem of the segment paths (None: local paths)

    @classmethod
    def from_settings(cls, settings) -> "EventStore":
        """The store of a :class:`pipeline.settings.Settings`: local directories, or an object
        store when ``settings.store`` is an ``s3://`` URL."""
        if settings.remote:
            from pipeline.ingest.object_store import ObjectEventStore

            return ObjectEventStore(settings.store)
        return cls(settings.store_dir, settings.dead_letter_dir)

    # ------------------------------------------------------------------ listing

    def _dir(self, kind: str, topic: str, partition: int) -> Path:
        if kind == DEAD_LETTER_KIND:
            return self.dead_letter_root / f"topic={topic}" / f"partition={partition}"
        return self.root / f"kind={kind}" / f"topic={topic}" / f"partition={partition}"

    def _kind_roots(self) -> Iterable[tuple[str, Path]]:
        for kind in KINDS:
            yield kind, self.root / f"kind={kind}"
        yield DEAD_LETTER_KIND, self.dead_letter_root

    def _all_segments(self, topics: Iterable[str] | None = None) -> list[Segment]:
        wanted = None if topics is None else set(topics)
        found = []
        for kind, kind_root in self._kind_roots():
            for topic_dir in _subdirs(kind_root, "topic="):
                topic = topic_dir.name[len("topic="):]
                if wanted is not None and topic not in wanted:
                    continue
                for part_dir in _subdirs(topic_dir, "partition="):
                    partition = int(part_dir.name[len("partition="):])
                    for entry in os.scandir(part_dir):
                        match = _SEGMENT_NAME.match(entry.name)
                        if match:
                            first, last, size = map(int, match.groups())
                            found.append(Segment(Path(entry.path), kind, topic, partition,
                                                 first, last, size))
        return found

    def segments(self, kind: str | None = None, topics: Iterable[str] | None = None, *,
                 complete: bool = True) -> list[Segment]:
        """Segments (of one kind, or all), sorted by topic, partition and offset. With
        ``complete=False`` the files of unfinished groups (crash leftovers) are listed instead."""
        found = self._all_segments(topics)
        members: dict[tuple, int] = defaultdict(int)
        for seg in found:
            members[seg.group] += 1
        chosen = [s for s in found if (members[s.group] == s.group_size) == complete
                  and (kind is None or s.kind == kind)]
        return sorted(chosen, key=lambda s: (s.topic, s.partition, s.first, s.kind))

    def next_offsets(self, topics: Iterable[str] | None = None,
                     kinds: Iterable[str] | None = None) -> dict[TopicPartition, int]:
        """One past the highest offset stored, per ``(topic, partition)`` (whole groups only).

        With ``kinds``, only segments of those kinds count: the snapshot of what a model that
        trains on them can read, which events of other kinds do not move."""
        wanted = None if kinds is None else set(kinds)
        result: dict[TopicPartition, int] = {}
        for seg in self.segments(topics=topics):
            if wanted is not None and seg.kind not in wanted:
                continue
            key = (seg.topic, seg.partition)
            result[key] = max(result.get(key, 0), seg.last + 1)
        return result

    def next_offset(self, topic: str, partition: int) -> int | None:
        """Where a consumer of this partition resumes; ``None`` if nothing is stored yet."""
        return self.next_offsets([topic]).get((topic, partition))

    # ------------------------------------------------------------------ topic generations
    #
    # A Kafka topic deleted and created again restarts its offsets at 0; its events are stored
    # under a new name, "TOPIC~gN" (N = 2, 3, ...), so they never clash with the offsets the
    # store holds from the old one, and every reader (datasets read a kind across topics)
    # sees both.

    def generation(self, topic: str, partition: int) -> str:
        """The store's name for the newest generation of ``topic``'s ``partition`` that holds
        segments (``topic`` itself when none has been re-created)."""
        best, best_n = topic, 1
        for name in self._topic_names():
            n = _generation_number(topic, name)
            if n > best_n and (self.next_offset(name, partition) is not None):
                best, best_n = name, n
        return best

    def _topic_names(self) -> set[str]:
        """Every topic name (generations included) the store has a directory for."""
        return {name for _, root in self._kind_roots()
                for name in (d.name[len("topic="):] for d in _subdirs(root, "topic="))}

    def next_generation(self, topic: str, partition: int) -> str:
        """The name for events of a re-created ``topic``: one past the newest generation."""
        current = self.generation(topic, partition)
        return f"{topic}{GENERATION_MARK}{_generation_number(topic, current) + 1}"

    # ------------------------------------------------------------------ writing

    @contextmanager
    def lock(self, topic: str, partition: int):
        """Exclusive ``flock`` on one topic partition of this store (released on exit or
        when the process dies)."""
        lock_dir = self.root / ".locks"
        lock_dir.mkdir(parents=True, exist_ok=True)
        with open(lock_dir / f"{topic}.{partition}.lock", "a+b") as fh:
            fcntl.flock(fh, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(fh, fcntl.LOCK_UN)

    def recover(self, topic: str, partition: int) -> list[Path]:
        """Delete the leftovers of an interrupted flush of this partition (files of unfinished
        groups and temporary files); returns what was deleted."""
        with self.lock(topic, partition):
            return self._recover(topic, partition)

    def _recover(self, topic: str, partition: int) -> list[Path]:
        removed = [s.path for s in self.segments(topics=[topic], complete=False)
                   if s.partition == partition]
        for _, kind_root in self._kind_roots():
            part_dir = kind_root / f"topic={topic}" / f"partition={partition}"
            if part_dir.is_dir():
                removed += [p for p in part_dir.iterdir() if p.name.endswith(".tmp")]
        for path in removed:
            path.unlink(missing_ok=True)
        for directory in {p.parent for p in removed}:
            fsync_dir(directory)
        return removed

    def write(self, topic: str, partition: int, first: int, last: int,
              tables: Mapping[str, pa.Table], dead_letters: pa.Table | None = None
              ) -> list[Path]:
        """Durably add one group of segments holding messages ``first..last`` of a partition.

        Parameters
        ----------
        tables : mapping kind -> pyarrow.Table
            Valid events per kind, in the kind's schema; empty tables are skipped.
        dead_letters : pyarrow.Table, optional
            Dead letters of the same messages (:data:`DEAD_LETTER_SCHEMA`).

        Raises
        ------
        OverlapError
            If ``first`` is not past what the store already holds for this partition.
        """
        parts = flush_parts(tables, dead_letters)
        if not parts:
            return []
        with self.lock(topic, partition):
            self._recover(topic, partition)
            refuse_overlap(topic, partition, first, self.next_offset(topic, partition) or 0)
            name = f"{first:020d}-{last:020d}-of{len(parts)}.parquet"
            meta = self._flush_meta(topic, partition, first, last, parts)
            moves = []
            for kind, table in parts.items():
                directory = self._dir(kind, topic, partition)
                makedirs_durable(directory)
                final = directory / name
                temp = directory / f".{name}.{os.getpid()}.tmp"
                self._write_segment(table, kind, meta, temp)
                fsync_file(temp)
                moves.append((temp, final))
            for temp, final in moves:
                os.replace(temp, final)
            for directory in {final.parent for _, final in moves}:
                fsync_dir(directory)
            return [final for _, final in moves]

    def _flush_meta(self, topic: str, partition: int, first: int, last: int,
                    parts: Mapping[str, pa.Table]) -> dict:
        """What every segment of a flush carries in its Parquet metadata."""
        return {"format_version": FORMAT_VERSION, "topic": topic, "partition": partition,
                "first_offset": first, "last_offset": last, "group": sorted(parts),
                "writer": self.writer, "written_at": int(time.time() * 1000)}

    def _write_segment(self, table: pa.Table, kind: str, meta: dict, where) -> None:
        table = table.replace_schema_metadata({"rankstream": json.dumps({**meta, "kind": kind})})
        pq.write_table(table, str(where), filesystem=self.filesystem,
                       compression=self.compression, **_encodings(table.schema))

    # ------------------------------------------------------------------ reading

    def read(self, kind: str, *, start_ts: int | None = None, end_ts: int | None = None,
             start_offsets: Mapping[TopicPartition, int] | None = None,
             end_offsets: Mapping[TopicPartition, int] | None = None,
             topics: Iterable[str] | None = None, columns: list[str] | None = None
             ) -> pa.Table:
        """Stored events of one kind in a time and/or offset window, as one Arrow table.

        Parameters
        ----------
        kind : str
            One of :data:`pipeline.ingest.events.KIND_NAMES`.
        start_ts, end_ts : int, optional
            Keep events with ``start_ts <= ts < end_ts`` (epoch ms).
        start_offsets, end_offsets : mapping (topic, partition) -> offset, optional
            Keep events from messages with ``start <= offset < end`` in their partition. With
            ``end_offsets``, partitions it does not name are left out, so
            ``end_offsets=store.next_offsets()`` taken earlier gives a fixed snapshot, and the
            next incremental read starts at ``start_offsets=`` that same mapping.
        topics : iterable of str, optional
            Only these topics (default: all, including file sources).
        columns : list of str, optional
            Only these columns (default: the kind's whole schema).

        Examples
        --------
        >>> import tempfile
        >>> EventStore(tempfile.mkdtemp()).read("rating", start_ts=0).num_rows
        0
        """
        kind_schema = schema(kind)
        columns = list(columns) if columns is not None else kind_schema.names
        time_filter = _window(pc.field("ts"), start_ts, end_ts)
        pieces, run = [], []          # run: consecutive segments read whole, in one scan
        for seg in self.segments(kind, topics):
            tp = (seg.topic, seg.partition)
            if end_offsets is not None and tp not in end_offsets:
                continue
            low = (start_offsets or {}).get(tp, 0)
            high = None if end_offsets is None else end_offsets[tp]
            if seg.last < low or (high is not None and seg.first >= high):
                continue
            if seg.first >= low and (high is None or seg.last < high):
                run.append(seg.path)
                continue
            if run:
                pieces.append(self._scan(run, kind_schema, columns, time_filter))
                run = []
            offset_filter = _window(pc.field("offset"), low, high)
            both = offset_filter if time_filter is None else (offset_filter & time_filter)
            pieces.append(self._scan([seg.path], kind_schema, columns, both))
        if run:
            pieces.append(self._scan(run, kind_schema, columns, time_filter))
        if not pieces:
            return kind_schema.empty_table().select(columns)
        return pa.concat_tables(pieces) if len(pieces) > 1 else pieces[0]

    def read_dead_letters(self, topic: str | None = None) -> pa.Table:
        """All dead letters in the local dead-letter directory (whole groups only)."""
        paths = [s.path for s in self.segments(DEAD_LETTER_KIND,
                                               None if topic is None else [topic])]
        if not paths:
            return DEAD_LETTER_SCHEMA.empty_table()
        return self._scan(paths, DEAD_LETTER_SCHEMA, DEAD_LETTER_SCHEMA.names, None)

    def _scan(self, paths, table_schema: pa.Schema, columns: list[str], expr) -> pa.Table:
        dataset = ds.dataset([str(p) for p in paths], schema=table_schema, format="parquet",
                             filesystem=self.filesystem)
        return dataset.to_table(columns=columns, filter=expr).replace_schema_metadata(None)

    def _size(self, seg: Segment) -> int:
        return seg.path.stat().st_size

    def stats(self) -> dict:
        """Per kind: segments, events, bytes, ts range; per partition: next offset."""
        per_kind: dict[str, dict] = {}
        for seg in self.segments():
            meta = pq.read_metadata(str(seg.path), filesystem=self.filesystem)
            entry = per_kind.setdefault(seg.kind, {"segments": 0, "events": 0, "bytes": 0,
                                                   "min_ts": None, "max_ts": None})
            entry["segments"] += 1
            entry["events"] += meta.num_rows
            entry["bytes"] += self._size(seg)
            if seg.kind != DEAD_LETTER_KIND:
                low, high = _ts_range(meta)
                if low is not None:
                    entry["min_ts"] = low if entry["min_ts"] is None else min(entry["min_ts"], low)
                    entry["max_ts"] = high if entry["max_ts"] is None else max(entry["max_ts"],
                                                                                 high)
        offsets = sorted(self.next_offsets().items())
        return {"kinds": per_kind,
                "next_offsets": {f"{t}/{p}": o for (t, p), o in offsets},
                "unfinished_files": len(self.segments(complete=False))}


def flush_parts(tables: Mapping[str, pa.Table], dead_letters: pa.Table | None
                ) -> dict[str, pa.Table]:
    """The segments of one flush, by kind: the non-empty tables, and the dead letters."""
    parts = {k: t for k, t in tables.items() if t.num_rows}
    if dead_letters is not None and dead_letters.num_rows:
        parts[DEAD_LETTER_KIND] = dead_letters
    return parts


def refuse_overlap(topic: str, partition: int, first: int, stored: int) -> None:
    """:class:`OverlapError` if a flush starting at ``first`` overlaps offsets below
    ``stored`` (the partition's end in the store)."""
    if first < stored:
        raise OverlapError(f"{topic}/{partition}: segment starts at offset {first} but the "
                           f"store already holds offsets up to {stored - 1}")


def copy_store(source: EventStore, target: EventStore) -> tuple[int, int]:
    """Copy every whole flush of ``source`` that ``target`` does not hold yet, with its offsets
    (say a local store into an object store, to move a deployment onto several hosts; or back).
    ``(copied, skipped)`` flushes: a flush the target already covers is skipped, so copying
    again, or after an interruption, copies only the rest."""
    groups: dict[tuple, list[Segment]] = defaultdict(list)
    for seg in source.segments():
        groups[seg.group].append(seg)
    copied = skipped = 0
    for (topic, partition, first, last), segs in sorted(groups.items()):
        tables = {s.kind: pq.read_table(str(s.path), filesystem=source.filesystem)
                  for s in segs}
        dead = tables.pop(DEAD_LETTER_KIND, None)
        try:
            target.write(topic, partition, first, last, tables, dead)
            copied += 1
        except OverlapError:
            skipped += 1
    return copied, skipped


# ---------------------------------------------------------------------- file helpers

def _dictionary_columns(table_schema: pa.Schema) -> list[str]:
    """Columns worth dictionary encoding: ids and labels repeat, event ids and times do not."""
    return [name for name in table_schema.names
            if name not in ("event_id", "ts", "offset", "raw", "rating", "text", "reason")
            and not name.startswith("feature_")]


_DELTA_COLUMNS = ("ts", "offset")     # near-sorted int64: delta encoding stores ~0 bytes each


def _encodings(table_schema: pa.Schema) -> dict:
    """``pq.write_table`` options of a segment: dictionaries for repeating columns, delta
    encoding for the near-sorted times and offsets, and min/max statistics only for those two,
    the columns that reads filter on (``read``'s windows, ``stats()``'s time range); statistics
    of the other columns cost about a quarter of the write time (unique event-id strings) and
    no read uses them. On the ratings of bench/ingest_throughput.py this took a segment from 9
    to 5 bytes and from ~150 to ~100 ns per event."""
    delta = [name for name in _DELTA_COLUMNS if name in table_schema.names
             and table_schema.field(name).type == pa.int64()]
    return {"use_dictionary": _dictionary_columns(table_schema),
            "column_encoding": dict.fromkeys(delta, "DELTA_BINARY_PACKED"),
            "write_statistics": delta}


def _subdirs(parent: Path, prefix: str) -> list[Path]:
    try:
        entries = list(os.scandir(parent))

    except FileNotFoundError:
        return []
    return [Path(e.path) for e in entries if e.is_dir() and e.name.startswith(prefix)]


def _window(field, low, high):
    expr = None
    if low is not None:
        expr = field >= low
    if high is not None:
        expr = (field < high) if expr is None else (expr & (field < high))
    return expr


def _ts_range(meta) -> tuple[int | None, int | None]:
    schema_arrow = meta.schema.to_arrow_schema()
    if "ts" not in schema_arrow.names:
        return None, None
    col = schema_arrow.get_field_index("ts")
    lows, highs = [], []
    for i in range(meta.num_row_groups):
        st = meta.row_group(i).column(col).statistics
        if st is not None and st.has_min_max:
            lows.append(st.min)
            highs.append(st.max)
    return (min(lows), max(highs)) if lows else (None, None)
