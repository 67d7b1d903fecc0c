"""The fast path of compact ingestion: column batches from msgpack bytes to Arrow columns
without a Python object per value.

A compact message (:func:`pipeline.ingest.codec.encode_batch`) holds ~1000 events as columns.
Decoding it with ``msgpack.unpackb`` makes a Python object per value, and checking and
converting those cost more than everything else in ingestion put together (compact ingest ran
at 0.3x the bare kafka-python loop, bench/ingest_throughput.py). Here, per message, the jitted
kernel :func:`pipeline.ingest._batch_kernels.read_batch` reads the bytes once, copying every
column's values into flat scratch arrays and summing each column up (types present, integer
min and max, string flags); the checks of :func:`pipeline.ingest.validate.validate_columns` are
decided on those summaries; and :func:`pipeline.ingest._batch_kernels.append_rows` appends the
stored fields to growing columns per kind. Arrow arrays are made once per poll, over those
columns: the Python work per message is a few calls, whatever its number of events.

**The fast path takes a message only when every event in it is valid** and the summaries show
it; :meth:`BatchReader.add` returns False otherwise (any value the checks would refuse, a
column mixing types, a kind with feature lists, anything not plainly a batch), and the message
takes the general path, which stores the valid events and names the reason of each bad one.
So the fast path changes how fast, never what is stored: a message gives the same rows either
way (tests/ingest/test_fast_paths.py checks it against the general path on random batches).

What the summaries decide, per stored field (the rules of pipeline.ingest.validate):

=========  ==========================================================================
event_id   every value a string: non-empty, at most MAX_ID_CHARS characters, no C0 control
           character or DEL
ts         every value an integer, Limits.min_ts <= min and max <= Limits.max_ts()
id field   every value a string (as event_id), or every value an integer (stored as its
           decimal text, like ``str(int)``)
number     every value an integer or a float within ±MAX_ABS_NUMBER (none NaN or infinite)
label      every value an integer in the label's range (min and max)
text       every value a string or nil (an optional field)
=========  ==========================================================================

plus the comparison rule winner != loser, checked on the stored text.

Examples
--------
>>> from pipeline.ingest.codec import encode_batch
>>> from pipeline.ingest.fast_batch import read_batch
>>> value = encode_batch("rating", [{"event_id": "e1", "ts": 5, "user": 7, "item": "a",
...                                  "rating": 4}])
>>> kind, table = read_batch(value, offset=42, default_kind=None, max_ts=10**13)
>>> kind, table.to_pylist()
('rating', [{'event_id': 'e1', 'ts': 5, 'offset': 42, 'user': '7', 'item': 'a', 'rating': 4.0}])
>>> read_batch(encode_batch("rating", [{"event_id": "e1", "ts": 5, "user": 7, "item": "a",
...                                     "rating": "four"}]), 42, None, 10**13) is None
True
"""

from __future__ import annotations

import threading

import numpy as np
import pyarrow as pa

from pipeline.ingest import _batch_kernels as K
from pipeline.ingest.codec import BATCH_VERSION
from pipeline.ingest.events import (
    BINARY,
    FEATURES,
    GRADE,
    ID,
    KINDS,
    MAX_ABS_NUMBER,
    MAX_ID_CHARS,
    NUMBER,
    ORDINAL,
    TEXT,
)
from pipeline.ingest.validate import LABEL_RANGE  # the same ranges as the general path

MAX_COLUMNS = 64                 # a batch with more columns takes the general path
FAST_KINDS = frozenset(k for k, spec in KINDS.items()
                       if not any(f.check == FEATURES for f in spec.fields))
_BAD_ID = K.EMPTY_STR | K.CONTROL_CHAR | K.LONG_STR
_NUMBER_TYPES = K.INT | K.FLOAT
_TEXT_TYPES = K.STR | K.NIL
_EVENT_ID, _TS = "event_id", "ts"
_STRING_CHECKS = (_EVENT_ID, ID, TEXT)
_INT_CHECKS = (_TS, GRADE, ORDINAL, BINARY)


class _Layout:
    """Where the stored fields of one kind accumulate: each field gets a slot among the string,
    integer or float columns."""

    def __init__(self, kind: str):
        self.schema = KINDS[kind].schema
        # (name, check, required, slot)
        self.fields: list[tuple[str, str, bool, int]] = []
        counts = {"str": 0, "int": 0, "float": 0}
        for name, check, required in ([(_EVENT_ID, _EVENT_ID, True), (_TS, _TS, True)]
                                      + [(f.name, f.check, f.required)
                                         for f in KINDS[kind].fields]):
            group = ("str" if check in _STRING_CHECKS else
                     "int" if check in _INT_CHECKS else "float")
            self.fields.append((name, check, required, counts[group]))
            counts[group] += 1
        self.n_str, self.n_int, self.n_float = counts["str"], counts["int"], counts["float"]


_LAYOUTS = {kind: _Layout(kind) for kind in FAST_KINDS}


class _Columns:
    """Growing columns of one kind (rows and string bytes double when full)."""

    def __init__(self, layout: _Layout, rows: int, chars: int):
        self.layout = layout
        self.rows = 0
        self.ints = np.empty((layout.n_int, rows), dtype=np.int64)
        self.floats = np.empty((layout.n_float, rows), dtype=np.float64)
        self.lengths = np.empty((layout.n_str, rows), dtype=np.int32)
        self.valid = np.empty((layout.n_str, rows), dtype=np.uint8)
        self.chars = np.empty((layout.n_str, chars), dtype=np.uint8)
        self.used = np.zeros(layout.n_str, dtype=np.int64)
        self.offsets: list[tuple[int, int]] = []        # (message offset, events)

    def reserve(self, n: int, chars_needed: np.ndarray) -> None:
        """Room for ``n`` more rows and ``chars_needed[s]`` more bytes in string slot ``s``."""
        rows = self.ints.shape[1]
        if self.rows + n > rows:
            rows = max(2 * rows, self.rows + n)
            self.ints = _grow(self.ints, rows, self.rows)
            self.floats = _grow(self.floats, rows, self.rows)
            self.lengths = _grow(self.lengths, rows, self.rows)
            self.valid = _grow(self.valid, rows, self.rows)
        need = int((self.used + chars_needed).max(initial=0))
        if need > self.chars.shape[1]:
            self.chars = _grow(self.chars, max(2 * self.chars.shape[1], need),
                               int(self.used.max(initial=0)))

    def table(self) -> pa.Table:
        n = self.rows
        arrays = {}
        for name, check, _, slot in self.layout.fields:
            if check in _STRING_CHECKS:
                arrays[name] = _strings(self.lengths[slot, :n], self.chars[slot],
                                        self.valid[slot, :n])
            elif check in _INT_CHECKS:
                values = self.ints[slot, :n]
                arrays[name] = pa.array(values if check == _TS else values.astype(np.int32))
            else:
                arrays[name] = pa.array(self.floats[slot, :n])
        offsets, counts = zip(*self.offsets)
        arrays["offset"] = pa.array(np.repeat(np.array(offsets, dtype=np.int64), counts))
        return pa.Table.from_arrays([arrays[name] for name in self.layout.schema.names],
                                    schema=self.layout.schema)


def _grow(array: np.ndarray, size: int, keep: int) -> np.ndarray:
    grown = np.empty(array.shape[:-1] + (size,), dtype=array.dtype)
    grown[..., :keep] = array[..., :keep]
    return grown


def _strings(lengths: np.ndarray, chars: np.ndarray, valid: np.ndarray) -> pa.Array:
    """A string array from value lengths, the bytes, and validity (0: null). Arrow's string
    offsets are int32: a column of 2 GiB or more (never from one poll) would be refused."""
    offsets = np.zeros(lengths.size + 1, dtype=np.int64)
    np.cumsum(lengths, out=offsets[1:])
    if offsets[-1] >= 2**31:
        raise OverflowError(f"a string column of {offsets[-1]} bytes, over Arrow's 2 GiB")
    bitmap = None
    if not valid.all():
        bitmap = pa.py_buffer(np.packbits(valid.astype(bool), bitorder="little"))
    return pa.StringArray.from_buffers(lengths.size, pa.py_buffer(offsets.astype(np.int32)),
                                       pa.py_buffer(chars[:offsets[-1]]), null_bitmap=bitmap)


class BatchReader:
    """Reads column-batch messages (of one poll) by the fast path into one table per kind.

    Parameters
    ----------
    default_kind : str, optional
        Kind of a batch that does not name one.
    max_ts : int
        The largest event time accepted (``Limits.max_ts()``).
    min_ts : int
        The earliest (``Limits.min_ts``).
    size_hint : int
        About how many bytes of messages will be read (the columns start that large and grow
        if need be; memory the columns do not use is never touched).
    """

    def __init__(self, default_kind: str | None, max_ts: int, size_hint: int = 1 << 20,
                 min_ts: int = 0):
        self.default_kind, self.max_ts, self.min_ts = default_kind, max_ts, min_ts
        # a compact rating takes ~31 bytes; no string column holds more bytes than its message
        self.rows, self.chars = max(1024, size_hint // 16), max(1 << 16, size_hint // 2)
        self.columns: dict[str, _Columns] = {}

    def __bool__(self) -> bool:
        return bool(self.columns)

    def add(self, value: bytes, offset: int) -> bool:
        """Read a message whose events are all valid, stored with ``offset``; False (and
        nothing read) if it must take the general path (see the module docstring)."""
        if type(value) is not bytes:     # the kernels are compiled for (read-only) bytes
            return False
        data = np.frombuffer(value, dtype=np.uint8)
        out = _scratch(data.size)
        ok, version, n, kind_start, kind_length, n_columns = K.read_batch(
            data, MAX_ID_CHARS, out.stats, out.ints, out.floats, out.valid, out.chars,
            out.offsets)
        if not ok or version != BATCH_VERSION or n == 0:
            return False
        kind = (value[kind_start:kind_start + kind_length].decode() if kind_start != K.ABSENT
                else self.default_kind)
        layout = _LAYOUTS.get(kind)
        if layout is None:
            return False
        stats = out.stats[:n_columns].tolist()
        where: dict[str, int] = {}
        for c, row in enumerate(stats):
            name = value[row[K.C_NAME]:row[K.C_NAME] + row[K.C_NAME_LEN]].decode()
            if name in where or row[K.C_COUNT] != n:
                return False       # a repeated name: msgpack keeps the last, leave it to it
            where[name] = c
        plan = np.empty((len(layout.fields), K.N_PLAN), dtype=np.int64)
        chars_needed = np.zeros(layout.n_str, dtype=np.int64)
        for f, (name, check, required, slot) in enumerate(layout.fields):
            c = where.get(name)
            what = (K.NULL_STR if c is None and not required else None if c is None
                    else self._what(stats[c], check, required))
            if what is None:
                return False
            base = stats[c][K.C_BASE] if c is not None else 0
            plan[f] = (what, slot, base, c if c is not None else 0)
            if what == K.STR_FROM_STR:
                chars_needed[slot] = out.offsets[base + c + n] - out.offsets[base + c]
            elif what == K.STR_FROM_INT:
                chars_needed[slot] = 20 * n
        if kind == "comparison" and self._same(out, plan, n):
            return False
        columns = self.columns.get(kind)
        if columns is None:
            columns = self.columns[kind] = _Columns(layout, self.rows, self.chars)
        columns.reserve(n, chars_needed)
        used_after = columns.used.copy()
        K.append_rows(plan, n, out.ints, out.floats, out.valid, out.chars, out.offsets,
                      columns.rows, columns.ints, columns.floats, columns.lengths,
                      columns.valid, columns.chars, columns.used, used_after)
        columns.used = used_after
        columns.rows += n
        columns.offsets.append((offset, n))
        return True

    def _what(self, row: list, check: str, required: bool) -> int | None:
        """How a column is stored (an ``append_rows`` plan code), or ``None`` if its summary
        does not show every value valid."""
        mask, flags = row[K.C_MASK], row[K.C_FLAGS]
        if check in (_EVENT_ID, ID) and mask == K.STR:
            return None if flags & _BAD_ID else K.STR_FROM_STR
        if mask == K.INT and check in (ID, *_INT_CHECKS):
            low, high = ((max(0, self.min_ts), self.max_ts) if check == _TS
                         else LABEL_RANGE.get(check, (None, None)))
            if low is not None and not (low <= row[K.C_INT_MIN] and row[K.C_INT_MAX] <= high):
                return None
            return K.STR_FROM_INT if check == ID else K.INT64
        if check == NUMBER and mask & _NUMBER_TYPES == mask and not flags & K.OUT_OF_RANGE:
            if mask & K.INT and not (-MAX_ABS_NUMBER <= row[K.C_INT_MIN]
                                     and row[K.C_INT_MAX] <= MAX_ABS_NUMBER):
                return None
            return K.FLOAT64
        if check == TEXT and not required and mask & _TEXT_TYPES == mask:
            return K.STR_FROM_STR
        return None

    @staticmethod
    def _same(out: _Scratch, plan: np.ndarray, n: int) -> bool:
        """Whether some comparison has winner == loser (as stored text)."""
        texts = []
        for what, _, base, c in plan[3:5].tolist():        # winner, loser
            if what == K.STR_FROM_INT:
                offsets, chars = K.int_text(out.ints[base:base + n])
                texts.append((offsets.astype(np.int64), chars))
            else:
                bounds = out.offsets[base + c:base + c + n + 1]
                texts.append((bounds, out.chars))
        return bool(K.equal_strings(*texts[0], *texts[1]).size)

    def take(self) -> dict[str, pa.Table]:
        """The tables of what was read (one per kind), and start afresh."""
        tables = {kind: columns.table() for kind, columns in self.columns.items()}
        self.columns = {}
        return tables


def read_batch(value: bytes, offset: int, default_kind: str | None, max_ts: int,
               min_ts: int = 0) -> tuple[str, pa.Table] | None:
    """``(kind, events)`` of one column-batch message whose events are all valid, in the kind's
    schema with ``offset`` in the offset column; ``None`` if it must take the general path."""
    reader = BatchReader(default_kind, max_ts, min_ts=min_ts)
    if not reader.add(value, offset):
        return None
    return next(iter(reader.take().items()))


class _Scratch(threading.local):
    """Per-thread outputs of the read kernel, grown as messages need and reused (no allocation
    and no page faults per message)."""

    def __init__(self):
        self.capacity = -1
        self.stats = np.empty((MAX_COLUMNS, K.N_STATS), dtype=np.int64)

    def grow(self, size: int) -> None:
        self.capacity = max(size, 2 * self.capacity, 1 << 16)
        self.ints = np.empty(self.capacity, dtype=np.int64)
        self.floats = np.empty(self.capacity, dtype=np.float64)
        self.valid = np.empty(self.capacity, dtype=np.uint8)
        self.chars = np.empty(self.capacity, dtype=np.uint8)
        self.offsets = np.empty(self.capacity + MAX_COLUMNS, dtype=np.int64)


_SCRATCH = _Scratch()


def _scratch(size: int) -> _Scratch:
    if _SCRATCH.capacity < size:
        _SCRATCH.grow(size)
    return _SCRATCH


def warm_up() -> float:
    """Load (or compile, on first use after an install) the kernels; returns the seconds it
    took. Ingestion runs it in a background thread on its first compact message
    (:func:`pipeline.ingest.buffer.load_fast_path`) and uses the fast path once it is done."""
    import time

    from pipeline.ingest.codec import encode_batch

    started = time.perf_counter()
    rows = [{"event_id": "e", "ts": 1, "user": 1, "item": "i", "rating": 1.0, "winner": "a",
             "loser": 2, "action": None}]
    for kind in sorted(FAST_KINDS):
        read_batch(encode_batch(kind, rows), 0, None, 2)
    return time.perf_counter() - started
