"""Decode, validate and buffer the messages of one topic partition until they are flushed to the
store as one segment group. Shared by Kafka ingestion and file ingestion.

Examples
--------
>>> import tempfile
>>> from pipeline.ingest.codec import encode_json
>>> from pipeline.ingest.buffer import PartitionBuffer
>>> from pipeline.ingest.local_store import LocalEventStore
>>> buf = PartitionBuffer("ratings", 0, default_kind="rating")
>>> buf.add_messages([encode_json({"event_id": "e1", "ts": 1_700_000_000_001, "user": 1, "item": 2,
...                                "rating": 5}), b"{oops"], [0, 1])
>>> buf.events, len(buf.dead)
(1, 1)
>>> store = LocalEventStore(tempfile.mkdtemp())
>>> buf.flush(store).events
Counter({'rating': 1})
>>> store.next_offsets()
{('ratings', 0): 2}
"""

from __future__ import annotations

import logging
import threading
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa

from pipeline.ingest.codec import DecodeError, batch_columns, batch_row, decode, is_batch, reencode
from pipeline.ingest.dead_letters import DeadLetters, Malformed
from pipeline.ingest.events import KINDS
from pipeline.ingest.store import OverlapError
from pipeline.ingest.validate import Limits, resolve_kind, show, validate_columns, validate_rows

DEFAULT_MAX_MESSAGE_BYTES = 1 << 20
_MSGPACK_MAP_FIRST_BYTES = frozenset(range(0x80, 0x90)) | {0xDE, 0xDF}
log = logging.getLogger(__name__)
_fast_failures = 0


@dataclass
class Flushed:
    """What one flush wrote."""

    events: Counter = field(default_factory=Counter)
    dead_letters: Counter = field(default_factory=Counter)
    files: int = 0


class PartitionBuffer:
    """Valid events (as Arrow tables per kind) and dead letters of one partition since the
    last flush, with the first and last offset they came from.

    Parameters
    ----------
    topic, partition : str, int
        Where the messages come from (a file source's synthetic topic, partition 0).
    default_kind : str, optional
        Kind of events that carry no ``kind`` field.
    max_message_bytes : int
        Larger messages are dead letters ("message is N bytes, over the limit of M").
    limits : Limits, optional
        Deployment bounds on event times and feature indices
        (:class:`pipeline.ingest.validate.Limits`).
    """

    def __init__(self, topic: str, partition: int, default_kind: str | None = None,
                 max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES,
                 limits: Limits | None = None):
        self.topic, self.partition = topic, partition
        self.default_kind = default_kind
        self.max_message_bytes = max_message_bytes
        self.limits = limits or Limits()
        self._clear()

    def _clear(self) -> None:
        self.tables: dict[str, list[pa.Table]] = {}
        self.dead = DeadLetters()
        self.first: int | None = None
        self.last: int | None = None
        self.events = 0
        self.started = time.monotonic()

    def take_events(self) -> dict[str, pa.Table]:
        """The valid events (kind -> table), emptying the buffer: for a reader that does not
        store them (the refresher: dead letters are ingest's to keep)."""
        out = {kind: pa.concat_tables(parts) for kind, parts in self.tables.items()}
        self._clear()
        return out

    def __len__(self) -> int:
        """Events plus dead letters buffered."""
        return self.events + len(self.dead)

    @property
    def empty(self) -> bool:
        return self.first is None

    def _span(self, first: int, last: int) -> None:
        if self.first is None:
            self.first = first
            self.started = time.monotonic()
        self.last = last

    def _keep(self, tables: dict[str, pa.Table]) -> None:
        for kind, table in tables.items():
            if table.num_rows:
                self.tables.setdefault(kind, []).append(table)
                self.events += table.num_rows

    def _mark(self) -> tuple:
        return {k: len(v) for k, v in self.tables.items()}, len(self.dead), self.events

    def _restore(self, mark: tuple) -> None:
        """Forget everything added since ``mark`` (see :meth:`add_messages`)."""
        lengths, n_dead, events = mark
        self.tables = {k: v[:lengths.get(k, 0)] for k, v in self.tables.items()
                       if lengths.get(k, 0)}
        self.dead.truncate(n_dead)
        self.events = events

    def add_messages(self, values: Sequence[bytes | None], offsets: Sequence[int]) -> None:
        """Decode and validate raw message values (offsets ascending).

        Atomic: when this returns, every message is in the buffer as events or dead letters and
        the buffer's span covers exactly them; when it raises, the buffer is as it was. The
        batch is validated column-wise in one go; if that raises (an input no check foresaw),
        the messages are taken one at a time by the general path (never the compact-batch fast
        path), and one that still raises becomes a dead letter naming the error, so that no
        message can stop its partition for good.
        """
        if not values:
            return
        mark = self._mark()
        try:
            self._add_messages(values, offsets)
        except Exception:
            self._restore(mark)
            for value, offset in zip(values, offsets):
                one = self._mark()
                try:
                    self._add_messages([value], [offset], fast_path=False)
                except Exception as err:
                    self._restore(one)
                    self.dead.add(offset, -1, f"could not be processed: "
                                  f"{type(err).__name__}: {str(err)[:200]}", value or b"")
        except BaseException:
            self._restore(mark)
            raise
        self._span(offsets[0], offsets[-1])

    def _add_messages(self, values, offsets, fast_path: bool = True) -> None:
        rows, row_offsets = [], []
        row_pos, row_index = [], []    # where a row came from: message position, index in it
        formats = {}
        fast, tried_fast = None, False  # the fast path's reader of column batches
        for pos, value in enumerate(values):
            offset = offsets[pos]
            if value is None:
                self.dead.add(offset, -1, "message is a tombstone (null value), expected an "
                              "event", b"")
                continue
            if len(value) > self.max_message_bytes:
                self.dead.add(offset, -1, f"message is {len(value)} bytes, over the limit of "
                              f"{self.max_message_bytes}", value)
                continue
            if fast_path and value and value[0] in _MSGPACK_MAP_FIRST_BYTES:
                if not tried_fast:  # once per call: None while the kernels load
                    fast, tried_fast = _fast_reader(self.default_kind, self.limits, values), True
                if fast is not None and _read_fast(fast, value, offset):
                    continue
            try:
                obj, fmt = decode(value)
            except DecodeError as err:
                self.dead.add(offset, -1, str(err), value)
                continue
            if type(obj) is dict:
                if is_batch(obj):
                    self._keep_fast(fast)     # batches are kept in message order
                    self._add_batch(obj, fmt, offset, value)
                    continue
                rows.append(obj)
                row_offsets.append(offset)
                row_pos.append(pos)
                row_index.append(-1)
            elif type(obj) is list and obj:
                rows.extend(obj)
                row_offsets.extend([offset] * len(obj))
                row_pos.extend([pos] * len(obj))
                row_index.extend(range(len(obj)))
                formats[pos] = fmt
            else:
                what = "an empty array" if type(obj) is list else show(obj)
                self.dead.add(offset, -1, f"message is {what}, expected an event object or an "
                              "array of events", value)
        self._keep_fast(fast)
        if rows:
            def raw_of(i):
                pos = row_pos[i]
                return values[pos] if row_index[i] < 0 else reencode(rows[i], formats[pos],
                                                                     whole=values[pos])
            self._validate(rows, row_offsets, row_index, raw_of)

    def _keep_fast(self, fast) -> None:
        """Keep what the fast path's reader read so far (and empty it)."""
        if fast:
            self._keep(fast.take())

    def add_rows(self, rows: list, offsets: Sequence[int],
                 raw_of: Callable[[int], bytes] | None = None) -> None:
        """Validate already decoded events (file sources); ``raw_of(i)`` gives the bytes kept
        for a dead letter (default: the row as JSON). Atomic like :meth:`add_messages`."""
        if not rows:
            return
        raw_of = raw_of or (lambda i: reencode(rows[i], "json"))
        mark = self._mark()
        try:
            good = [i for i, row in enumerate(rows) if type(row) is not Malformed]
            for i in range(len(rows)):
                if type(rows[i]) is Malformed:
                    self.dead.add(offsets[i], -1, rows[i].reason, rows[i].raw)
            if good:
                self._validate([rows[i] for i in good], [offsets[i] for i in good],
                               [-1] * len(good), lambda j: raw_of(good[j]))
        except BaseException:
            self._restore(mark)
            raise
        self._span(offsets[0], offsets[-1])

    def _validate(self, rows, offsets, indexes, raw_of) -> None:
        tables, bad = validate_rows(rows, np.asarray(offsets, dtype=np.int64), self.default_kind,
                                    self.limits)
        self._keep(tables)
        for i in sorted(bad):
            row = rows[i]
            kind = row.get("kind", self.default_kind) if type(row) is dict else None
            self.dead.add(offsets[i], indexes[i], bad[i], raw_of(i),
                          kind if type(kind) is str and kind in KINDS else None)

    def _add_batch(self, batch: dict, fmt: str, offset: int, value: bytes) -> None:
        try:
            columns, n = batch_columns(batch)
            kind = resolve_kind({k: v for k, v in batch.items() if k == "kind"},
                                self.default_kind)
            if n == 0:
                raise DecodeError("batch: holds no events")
        except (DecodeError, ValueError) as err:
            self.dead.add(offset, -1, str(err), value)
            return
        table, bad = validate_columns(kind, columns, n, np.full(n, offset, dtype=np.int64),
                                      self.limits)
        self._keep({kind: table})
        for i in sorted(bad):
            self.dead.add(offset, i, bad[i], reencode(batch_row(columns, i), fmt, whole=value),
                          kind)

    def flush(self, store, publisher=None) -> Flushed:
        """Write what is buffered as one segment group (dead letters sent to the dead-letter
        topic first, if a publisher is given) and start afresh.

        If anything raises, the buffer is left as it was (nothing is half-flushed), except for
        :class:`pipeline.ingest.store.OverlapError`: the store already holds these offsets, so
        the buffer is dropped.
        """
        if self.empty:
            return Flushed()
        group = self._group()
        try:
            done = group.write(store, publisher)
        except OverlapError:
            self._clear()
            raise
        self._clear()
        return done

    def detach(self) -> SegmentGroup | None:
        """What is buffered, as a :class:`SegmentGroup` to write (e.g. in another thread), and
        start afresh; ``None`` if the buffer is empty. The caller owns the group: if writing it
        fails, its messages are not stored, and whoever reads the partition next must start
        from the store's end (``EventStore.next_offset``), not from after this group."""
        if self.empty:
            return None
        group = self._group()
        self._clear()
        return group

    def _group(self) -> SegmentGroup:
        return SegmentGroup(
            self.topic, self.partition, self.first, self.last,
            {kind: pa.concat_tables(parts) for kind, parts in self.tables.items()},
            self.dead.table(self.topic, self.partition) if len(self.dead) else None,
            self.dead.counts())


@dataclass
class SegmentGroup:
    """The events and dead letters of messages ``first..last`` of one partition, ready to be
    written as one segment group (:meth:`write`)."""

    topic: str
    partition: int
    first: int
    last: int
    tables: dict[str, pa.Table]
    dead: pa.Table | None
    dead_counts: Counter

    def write(self, store, publisher=None) -> Flushed:
        """Send the dead letters to the dead-letter topic (if a publisher is given), then write
        the group durably to the store (:meth:`pipeline.ingest.store.EventStore.write`, which
        raises ``OverlapError`` if the store already holds these offsets)."""
        if self.dead is not None and publisher is not None:
            publisher.publish(self.dead)
        files = store.write(self.topic, self.partition, self.first, self.last, self.tables,
                            self.dead)
        return Flushed(Counter({kind: t.num_rows for kind, t in self.tables.items()}),
                       Counter(self.dead_counts), len(files))


def _fast_reader(default_kind: str | None, limits: Limits, values: Sequence):
    """A :class:`pipeline.ingest.fast_batch.BatchReader` sized for ``values``, or ``None``
    while the fast path's kernels are not loaded."""
    fast = _FAST_PATH.get()
    if fast is None:
        return None
    return fast.BatchReader(default_kind, limits.max_ts(), sum(map(len, filter(None, values))),
                            min_ts=limits.min_ts)


def _read_fast(reader, value: bytes, offset: int) -> bool:
    """Whether the fast path took the message (a column batch whose events are all valid);
    if not, the general path takes it. The fast path can only ever cost speed: should it raise
    (a bug), the general path takes the message and the error is logged (the first few
    times)."""
    global _fast_failures
    try:
        return reader.add(value, offset)
    except Exception as err:
        _fast_failures += 1
        if _fast_failures <= 3:
            log.warning("fast column-batch path failed on a message (%s: %s); "
                        "the general path takes it", type(err).__name__, err)
        return False


class _FastPath:
    """:mod:`pipeline.ingest.fast_batch`, loaded by a background thread on first need: its
    kernels take a second to load from numba's cache (tens to compile after an install), and
    until they are ready compact batches take the general path (same results, slower)."""

    def __init__(self):
        self.module = None
        self.thread: threading.Thread | None = None
        self.lock = threading.Lock()

    def get(self):
        """The module if its kernels are loaded, else ``None`` (and start loading them)."""
        if self.module is None:
            self._start()
        return self.module

    def wait(self, timeout: float | None = None) -> bool:
        """Load the kernels now (or wait for the loading thread); whether they are ready."""
        self._start()
        self.thread.join(timeout)
        return self.module is not None

    def _start(self) -> None:
        with self.lock:
            if self.thread is None:
                self.thread = threading.Thread(target=self._load, name="rankstream-jit",
                                               daemon=True)
                self.thread.start()

    def _load(self) -> None:
        try:
            from pipeline.ingest import fast_batch

            fast_batch.warm_up()
            self.module = fast_batch
        except Exception as err:       # no numba, a compile error: the general path it is
            log.warning("compact-batch fast path unavailable (%s: %s); compact batches take "
                        "the general path", type(err).__name__, err)


_FAST_PATH = _FastPath()


def load_fast_path(timeout: float | None = None) -> bool:
    """Load the compact-batch kernels now instead of in the background on first need (for
    benchmarks and tests, whose first batches should not run without them); whether they are
    ready."""
    return _FAST_PATH.wait(timeout)
