"""The event store in local directories (or a shared POSIX file system): segment groups made
durable by ``fsync`` + ``rename``, one ``flock`` per topic partition.

Layout::

    {store_dir}/kind=rating/topic=ratings/partition=0/00000000000000000000-00000000000000004999-of2.parquet
    {dead_letter_dir}/topic=ratings/partition=0/00000000000000000000-00000000000000004999-of2.parquet

A file name carries the first and last offset of the messages it was written from and the size
of its **group** (one flush): ``-of2`` above is a rating segment and a dead-letter segment. Each
file is written to a temporary name, fsynced and renamed, then the directories are fsynced. A
group whose files are not all there is a crash leftover: readers ignore it and the next writer
deletes it. Writers hold an ``flock`` per topic partition (:meth:`LocalEventStore.lock`) and
refuse a group that overlaps what is stored.

Examples
--------
>>> import tempfile, pyarrow as pa
>>> from pipeline.ingest.events import schema
>>> store = LocalEventStore(tempfile.mkdtemp())
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
import os
import re
import socket
from collections import defaultdict
from collections.abc import Iterable, Mapping
from contextlib import contextmanager
from pathlib import Path

import pyarrow as pa

from pipeline.durable import fsync_dir, fsync_file, makedirs_durable
from pipeline.ingest.dead_letters import DEAD_LETTER_KIND
from pipeline.ingest.events import KINDS
from pipeline.ingest.store import EventStore, Segment, refuse_overlap

_SEGMENT_NAME = re.compile(r"^(\d{20})-(\d{20})-of(\d+)\.parquet$")


class LocalEventStore(EventStore):
    """Parquet segments under ``root`` (events) and ``dead_letter_root`` (dead letters).

    Parameters
    ----------
    root : path
        The store directory (``Settings.store_dir``).
    dead_letter_root : path, optional
        The dead-letter directory (``Settings.dead_letter_dir``); default ``root/../dead-letter``.
    compression : str
        Parquet codec of new segments (:class:`~pipeline.ingest.store.EventStore`).
    """

    def __init__(self, root: str | Path, dead_letter_root: str | Path | None = None, *,
                 compression: str = "lz4"):
        super().__init__(writer=f"{socket.gethostname()}:{os.getpid()}",
                         compression=compression)
        self.root = Path(root)
        self.dead_letter_root = (Path(dead_letter_root) if dead_letter_root is not None
                                 else self.root.parent / "dead-letter")

    def __repr__(self) -> str:
        return f"LocalEventStore({str(self.root)!r}, {str(self.dead_letter_root)!r})"

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
        """Every segment file, of whole groups or not."""
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

    def _listed(self, topics: Iterable[str] | None, complete: bool) -> list[Segment]:
        """A group is whole when all the files its names count are there."""
        found = self._all_segments(topics)
        members: dict[tuple, int] = defaultdict(int)
        for seg in found:
            members[seg.group] += 1
        return [s for s in found if (members[s.group] == s.group_size) == complete]

    def _topic_names(self) -> set[str]:
        return {name for _, root in self._kind_roots()
                for name in (d.name[len("topic="):] for d in _subdirs(root, "topic="))}

    def _size(self, seg: Segment) -> int:
        return Path(seg.path).stat().st_size

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

    def _write_flush(self, topic: str, partition: int, first: int, last: int,
                     parts: Mapping[str, pa.Table]) -> list[Path]:
        """Under the partition's lock: delete leftovers, refuse an overlap, write each segment
        to a temporary name and fsync it, then rename them all and fsync their directories."""
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


def _subdirs(parent: Path, prefix: str) -> list[Path]:
    try:
        entries = list(os.scandir(parent))
    except FileNotFoundError:
        return []
    return [Path(e.path) for e in entries if e.is_dir() and e.name.startswith(prefix)]
