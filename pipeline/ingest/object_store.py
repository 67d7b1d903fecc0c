"""The event store on an object store (``RANKSTREAM_STORE=s3://bucket/prefix``): the same
segments, schemas and reads as every :class:`~pipeline.ingest.store.EventStore` (its sibling,
:class:`~pipeline.ingest.local_store.LocalEventStore`, keeps them in local directories),
committed without rename or ``flock``.

Layout under the prefix::

    store/kind=rating/topic=ratings/partition=0/{first}-{last}-{writer}.parquet
    dead-letter/topic=ratings/partition=0/{first}-{last}-{writer}.parquet
    store/_commits/topic=ratings/partition=0/{position:020d}.json

**The commit chain.** Each topic partition's flushes form a chain of commit objects. A commit
is created at the *position* where the chain ended when its writer looked (0 for the first),
names its segment files and covers offsets ``first..last`` (``first >= position``; Kafka
offsets may skip), so the next commit's position is ``last + 1``. A flush is:

1. write its segment files under names no other writer uses (the writer's id is in them);
2. create the commit object at the chain's end with ``If-None-Match: *``.

Step 2 is the only step that makes anything visible, and an object store performs a
create-only put for exactly one of any number of writers. So:

- *no reader sees a half-written flush*: readers follow the chain from position 0 and read only
  the files its commits name; a commit is created after all of its files are whole (a PUT is
  atomic per object), so every file a reader is sent to exists, whole;
- *nothing is stored twice*: two writers of one partition (two hosts, a consumer that lost its
  partition without noticing, a paused process) race for the same position; the loser gets
  HTTP 412, deletes its own files and raises :class:`~pipeline.ingest.store.OverlapError`,
  and its consumer resumes from the chain's new end. This is the per-partition writer's fence:
  the position plays the part of a fencing token, checked by the store itself, so it needs no
  lease, no clock and no Redis;
- *nothing is lost*: a writer killed before step 2 leaves only files no commit names
  (``segments(complete=False)``; deleted an hour later by the partition's next writer), and
  its consumer resumes at the chain's end, before those offsets.

A commit is never rewritten, so each process caches the ones it has read: listing the chain
costs one LIST, and only new commits are fetched.

**Files ingested straight into it** (``rankstream ingest --files`` with an ``s3://`` store) keep
their record keys (:mod:`pipeline.ingest.ledger`) under ``store/_files/``: a key object is named
after the flush it describes, writer included, and counts only once a commit of the file log
names that flush, so a writer that lost the race or died before its commit leaves keys nobody
counts (deleted an hour later). No lock is needed: two ingests of files at once race for the
same chain position, and the loser stops with nothing of its flush stored.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import re
import time
import uuid
from collections.abc import Iterable, Mapping
from pathlib import Path

import numpy as np
import pyarrow as pa

from pipeline.ingest.dead_letters import DEAD_LETTER_KIND
from pipeline.ingest.ledger import FILE_TOPIC
from pipeline.ingest.store import (
    EventStore,
    OverlapError,
    Segment,
    TopicPartition,
    refuse_overlap,
)
from pipeline.storage import ObjectStore, object_store_for

COMMITS = "_commits"
ORPHAN_SECONDS = 3600.0      # uncommitted files older than this are a dead writer's leftovers
_COMMIT_KEY = re.compile(r"/topic=([^/]+)/partition=(\d+)/(\d{20})\.json$")
_DATA_KEY = re.compile(r"/topic=([^/]+)/partition=(\d+)/(\d{20})-(\d{20})-[^/]+\.parquet$")
_KEYS_NAME = re.compile(r"/(\d{20})-(\d{20})-([^/]+)\.npy$")


class ObjectEventStore(EventStore):
    """Parquet segments in an object store, committed by create-only puts (module docstring).

    Parameters
    ----------
    url : str
        ``s3://bucket/prefix``; events go under ``prefix/store``, dead letters under
        ``prefix/dead-letter``.
    compression : str
        Parquet codec of new segments (:class:`~pipeline.ingest.store.EventStore`).
    objects : ObjectStore, optional
        The client (default: the process's one for ``url``,
        :func:`pipeline.storage.object_store_for`, from the ``AWS_*`` environment).
    """

    def __init__(self, url: str, *, compression: str = "lz4", objects: ObjectStore | None = None):
        # unique per store object: two stores in one process are two writers
        super().__init__(writer=f"{os.uname().nodename}-{os.getpid()}-{uuid.uuid4().hex[:8]}",
                         compression=compression)
        self.objects = objects or object_store_for(url)
        self.root = self.objects.url("store")
        self.dead_letter_root = self.objects.url("dead-letter")
        self._commits: dict[str, dict] = {}          # commit key -> its (immutable) content
        self._ends: dict[TopicPartition, int] = {}   # chain ends this writer made

    def __repr__(self) -> str:
        return f"ObjectEventStore({self.objects.url()!r})"

    @property
    def filesystem(self):
        return self.objects.fs

    # ------------------------------------------------------------------ the chains

    def _commit_key(self, topic: str, partition: int, position: int) -> str:
        return self.objects.key("store", COMMITS, f"topic={topic}", f"partition={partition}",
                                f"{position:020d}.json")

    def _listed_commits(self, topics: Iterable[str] | None) -> dict[str, tuple[str, int, int]]:
        """Commit key -> (topic, partition, position) of every commit object: one LIST per
        prefix; the commits this process has not read yet are fetched into its cache."""
        prefixes = ([self.objects.key("store", COMMITS) + "/"] if topics is None else
                    [self.objects.key("store", COMMITS, f"topic={t}") + "/" for t in set(topics)])
        listed = {}
        for obj in (o for prefix in prefixes for o in self.objects.list(prefix)):
            match = _COMMIT_KEY.search(obj.key)
            if match:
                listed[obj.key] = (match.group(1), int(match.group(2)), int(match.group(3)))
        new = [k for k in listed if k not in self._commits]
        for key, data in zip(new, self.objects.get_many(new)):
            if data is not None:
                self._commits[key] = json.loads(data)
        return listed

    def _chains(self, topics: Iterable[str] | None = None) -> dict[TopicPartition, list[dict]]:
        """Each partition's committed flushes, in offset order, followed from position 0."""
        at: dict[TopicPartition, dict[int, dict]] = {}
        for key, (topic, partition, position) in self._listed_commits(topics).items():
            if key in self._commits:
                at.setdefault((topic, partition), {})[position] = self._commits[key]
        chains = {}
        for tp, by_position in at.items():
            chain, commit = [], by_position.get(0)
            while commit is not None:
                chain.append(commit)
                commit = by_position.get(commit["last"] + 1)
            chains[tp] = chain
        return chains

    def _committed(self, topics: Iterable[str] | None) -> list[Segment]:
        found = []
        for (topic, partition), chain in self._chains(topics).items():
            for commit in chain:
                files = commit["files"]
                for kind, key in files.items():
                    found.append(Segment(self.objects.fs_path(key), kind, topic, partition,
                                         commit["first"], commit["last"], len(files)))
        return found

    def _listed(self, topics: Iterable[str] | None, complete: bool) -> list[Segment]:
        """The files the chains' commits name (``complete``), or the files no commit names (a
        dead writer's leftovers)."""
        if complete:
            return self._committed(topics)
        return [_orphan_segment(o.key, self.objects) for o in self._orphans(topics)]

    def _orphans(self, topics: Iterable[str] | None = None, partition: int | None = None):
        named = {self.objects.fs_path(key) for chain in self._chains(topics).values()
                 for commit in chain for key in commit["files"].values()}
        wanted = None if topics is None else set(topics)
        found = []
        for root in ("store", "dead-letter"):
            for obj in self.objects.list(self.objects.key(root) + "/"):
                match = _DATA_KEY.search(obj.key)
                if (match and self.objects.fs_path(obj.key) not in named
                        and (wanted is None or match.group(1) in wanted)
                        and (partition is None or int(match.group(2)) == partition)):
                    found.append(obj)
        return found

    def _topic_names(self) -> set[str]:
        return {topic for topic, _ in self._chains()}

    def _size(self, seg: Segment) -> int:
        return self.filesystem.get_file_info(str(seg.path)).size

    # ------------------------------------------------------------------ writing
    #
    # No lock: the create-only commit at the chain's end fences writers (module docstring).

    def recover(self, topic: str, partition: int) -> list[str]:
        """Delete this partition's uncommitted files older than an hour: a dead writer's
        (a live writer commits within seconds of writing them)."""
        cutoff = time.time() - ORPHAN_SECONDS
        old = [o.key for o in self._orphans([topic], partition) if o.modified < cutoff]
        self.objects.delete(old)
        return old

    def _write_flush(self, topic: str, partition: int, first: int, last: int,
                     parts: Mapping[str, pa.Table]) -> list[str]:
        """The flush's files, then its commit at the chain's end. Raises :class:`OverlapError`
        if the chain already covers ``first``, or another writer committed at that position
        first (this flush's files are then deleted)."""
        position = self._ends.get((topic, partition))
        if position is None:       # a writer that made the chain's end knows it without a LIST
            chain = self._chains([topic]).get((topic, partition), [])
            position = chain[-1]["last"] + 1 if chain else 0
        refuse_overlap(topic, partition, first, position)
        name = f"{first:020d}-{last:020d}-{self.writer}.parquet"
        meta = self._flush_meta(topic, partition, first, last, parts)
        files = {}
        for kind, table in parts.items():
            root = ("dead-letter",) if kind == DEAD_LETTER_KIND else ("store", f"kind={kind}")
            key = self.objects.key(*root, f"topic={topic}", f"partition={partition}", name)
            self._write_segment(table, kind, meta, self.objects.fs_path(key))
            files[kind] = key
        commit = {"first": first, "last": last, "position": position, "files": files,
                  "writer": self.writer, "written_at": meta["written_at"]}
        commit_key = self._commit_key(topic, partition, position)
        if not self.objects.create(commit_key, json.dumps(commit).encode()):
            self._ends.pop((topic, partition), None)
            self.objects.delete(list(files.values()))
            raise OverlapError(f"{topic}/{partition}: another writer committed offsets from "
                               f"{position} first; this flush ({first}..{last}) was dropped")
        self._commits[commit_key] = commit
        self._ends[(topic, partition)] = last + 1
        return [self.objects.fs_path(k) for k in files.values()]


def _orphan_segment(key: str, objects: ObjectStore) -> Segment:
    topic, partition, first, last = _DATA_KEY.search(key).groups()
    kind = (DEAD_LETTER_KIND if "/kind=" not in key
            else key.split("/kind=", 1)[1].split("/", 1)[0])
    return Segment(objects.fs_path(key), kind, topic, int(partition), int(first), int(last), 0)


class ObjectFileLedger:
    """The file ledger (:class:`pipeline.ingest.ledger.FileLedger`'s interface) of an object
    store, under ``store/_files/`` (module docstring)."""

    def __init__(self, store: ObjectEventStore):
        self.store = store
        self.objects = store.objects

    def _key(self, *parts: str) -> str:
        return self.objects.key("store", "_files", *parts)

    def stored_keys(self, next_offset: int) -> np.ndarray:
        """Sorted keys of every record of the file log's committed flushes (``next_offset``
        is the local sibling's crash rule; here a commit naming the flush decides). Key
        objects no commit names and older than an hour are deleted."""
        chain = self.store._chains([FILE_TOPIC]).get((FILE_TOPIC, 0), [])
        committed = {(c["first"], c["last"], c["writer"]) for c in chain}
        counted, stale = [o.key for o in self.objects.list(self._key("legacy") + "/")], []
        cutoff = time.time() - ORPHAN_SECONDS
        for obj in self.objects.list(self._key("keys") + "/"):
            match = _KEYS_NAME.search(obj.key)
            if match and (int(match[1]), int(match[2]), match[3]) in committed:
                counted.append(obj.key)
            elif obj.modified < cutoff:
                stale.append(obj.key)
        self.objects.delete(stale)
        parts = [_load(data) for data in self.objects.get_many(counted) if data is not None]
        return np.unique(np.concatenate(parts)) if parts else np.zeros(0, np.uint64)

    def add(self, first: int, last: int, keys) -> None:
        """Record the keys of the flush ``first..last`` that this store's writer commits next
        (before the flush: they count once its commit exists)."""
        self.objects.put(self._key("keys", f"{first:020d}-{last:020d}-{self.store.writer}.npy"),
                         _dump(keys))

    def add_legacy(self, path: str | Path, keys) -> None:
        self.objects.put(self._key("legacy", self._path_name(path)), _dump(keys))

    def last_seen(self, path: str | Path) -> np.ndarray | None:
        data = self.objects.get(self._key("paths", self._path_name(path)))
        return None if data is None else _load(data)

    def remember(self, path: str | Path, keys) -> None:
        self.objects.put(self._key("paths", self._path_name(path)), _dump(keys))

    @staticmethod
    def _path_name(path) -> str:
        resolved = str(Path(path).resolve()).encode()
        return f"{hashlib.sha256(resolved).hexdigest()[:24]}.npy"


def _dump(keys) -> bytes:
    out = io.BytesIO()
    np.save(out, np.unique(np.asarray(keys, np.uint64)), allow_pickle=False)
    return out.getvalue()


def _load(data: bytes) -> np.ndarray:
    return np.load(io.BytesIO(data), allow_pickle=False)
