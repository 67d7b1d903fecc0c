"""The event store's one interface: append-only Parquet segments per topic partition, one schema
per kind, written a whole flush at a time. Two siblings implement it, chosen once by
:func:`pipeline.ingest.open_store.open_store`:

- :class:`pipeline.ingest.local_store.LocalEventStore`: directories on a POSIX file system,
  committed by ``fsync`` + ``rename``, one ``flock`` per topic partition;
- :class:`pipeline.ingest.object_store.ObjectEventStore`: an S3-compatible object store,
  committed by a create-only put at the end of each partition's commit chain.

Both store hive-style layouts (``kind=rating/topic=ratings/partition=0/...parquet``), so
``pyarrow.dataset``, DuckDB or Spark read them as they are. A **flush** of a topic partition
(messages ``first..last``) writes one segment per kind present plus one dead-letter segment if
there were bad events. Readers see whole flushes only, and ``next_offsets()`` (one past the last
offset of the last whole flush) is where a restarted consumer resumes: each message's events are
in the store exactly once, whenever the process was killed. A flush that overlaps what is stored
is refused (:class:`OverlapError`), so a consumer that lost its partition without noticing
cannot write it twice. What a crashed writer left behind is listed by
``segments(complete=False)`` and deleted by ``recover()``.

This module holds what both share: the listing contract, offsets and topic generations, the
flush's Parquet files and metadata, window reads, statistics and :func:`copy_store`. It imports
neither implementation.

File sources use the same store under one synthetic topic, ``~files`` (a name no Kafka topic
can have), partition 0, whose offsets are append positions (see :mod:`pipeline.ingest.ledger`).
"""

from __future__ import annotations

import hashlib
import json
import re
import time
from abc import ABC, abstractmethod
from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as ds
import pyarrow.parquet as pq

from pipeline.ingest.dead_letters import DEAD_LETTER_KIND, DEAD_LETTER_SCHEMA
from pipeline.ingest.events import schema

FORMAT_VERSION = 1
TopicPartition = tuple[str, int]


class OverlapError(RuntimeError):
    """A segment group would overlap offsets already in the store."""


@dataclass(frozen=True)
class Segment:
    """One segment file: ``kind`` is an event kind or ``"dead_letter"``; ``path`` a local path,
    or on an object store the ``bucket/key`` of the store's ``filesystem``."""

    path: Path | str
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


class EventStore(ABC):
    """The event store's interface and shared logic (module docstring); open one with
    :func:`pipeline.ingest.open_store.open_store`.

    Attributes
    ----------
    root, dead_letter_root : Path or str
        Where events and dead letters are (for messages; directories of a local store, the
        ``s3://`` URLs of an object store).
    filesystem : pyarrow.fs.FileSystem or None
        The file system of segment paths (None: local paths).
    writer : str
        This writer's id, recorded in every segment it writes.
    compression : str
        Parquet codec of new segments. ``"lz4"`` (default) writes about 1.4x as fast as
        ``"zstd"``, which makes files about 2.5x smaller (bench data: 5 vs 2 bytes per rating).
    """

    root: Path | str
    dead_letter_root: Path | str
    filesystem = None

    def __init__(self, *, writer: str, compression: str = "lz4"):
        self.writer = writer
        self.compression = compression

    # ------------------------------------------------------------------ what a sibling provides

    @abstractmethod
    def _listed(self, topics: Iterable[str] | None, complete: bool) -> list[Segment]:
        """The segments of whole flushes (``complete``) or a crashed writer's leftovers (not),
        of ``topics`` (None: all), in any order."""

    @abstractmethod
    def _topic_names(self) -> set[str]:
        """Every topic name (generations included) the store holds."""

    @abstractmethod
    def _write_flush(self, topic: str, partition: int, first: int, last: int,
                     parts: Mapping[str, pa.Table]) -> list:
        """Durably add one flush (non-empty ``parts`` by kind) or raise :class:`OverlapError`;
        the paths of its segments."""

    @abstractmethod
    def recover(self, topic: str, partition: int) -> list:
        """Delete a crashed writer's leftovers in this partition; returns what was deleted."""

    @abstractmethod
    def _size(self, seg: Segment) -> int:
        """The segment file's size in bytes."""

    # ------------------------------------------------------------------ listing

    def segments(self, kind: str | None = None, topics: Iterable[str] | None = None, *,
                 complete: bool = True) -> list[Segment]:
        """Segments (of one kind, or all), sorted by topic, partition and offset. With
        ``complete=False`` the files of unfinished flushes (crash leftovers) are listed instead."""
        chosen = [s for s in self._listed(topics, complete) if kind is None or s.kind == kind]
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

    def next_generation(self, topic: str, partition: int) -> str:
        """The name for events of a re-created ``topic``: one past the newest generation."""
        current = self.generation(topic, partition)
        return f"{topic}{GENERATION_MARK}{_generation_number(topic, current) + 1}"

    # ------------------------------------------------------------------ writing

    def write(self, topic: str, partition: int, first: int, last: int,
              tables: Mapping[str, pa.Table], dead_letters: pa.Table | None = None
              ) -> list:
        """Durably add one group of segments holding messages ``first..last`` of a partition.

        Parameters
        ----------
        tables : mapping kind -> pyarrow.Table
            Valid events per kind, in the kind's schema; empty tables are skipped.
        dead_letters : pyarrow.Table, optional
            Dead letters of the same messages (:data:`DEAD_LETTER_SCHEMA`).

        Returns
        -------
        list
            The paths of the new segments (none if every table was empty).

        Raises
        ------
        OverlapError
            If ``first`` is not past what the store already holds for this partition (or, on
            an object store, another writer committed these offsets first).
        """
        parts = flush_parts(tables, dead_letters)
        if not parts:
            return []
        return self._write_flush(topic, partition, first, last, parts)

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
        """All dead letters in the store (whole groups only), of one topic or all."""
        paths = [s.path for s in self.segments(DEAD_LETTER_KIND,
                                               None if topic is None else [topic])]
        if not paths:
            return DEAD_LETTER_SCHEMA.empty_table()
        return self._scan(paths, DEAD_LETTER_SCHEMA, DEAD_LETTER_SCHEMA.names, None)

    def _scan(self, paths, table_schema: pa.Schema, columns: list[str], expr) -> pa.Table:
        dataset = ds.dataset([str(p) for p in paths], schema=table_schema, format="parquet",
                             filesystem=self.filesystem)
        return dataset.to_table(columns=columns, filter=expr).replace_schema_metadata(None)

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
