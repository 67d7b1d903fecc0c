"""File ingestion (embedded mode, no Kafka): JSON lines, CSV, Parquet, MovieLens or SVMlight
files are validated into the same event store as Kafka messages, local or an object store,
appended to one log of file records
keyed by content (:mod:`pipeline.ingest.ledger`): ingesting a file again, edited or copied,
stores only its new and changed records and reports the removed ones.

Examples
--------
>>> import tempfile, pathlib
>>> from pipeline.ingest.files import ingest_files
>>> from pipeline.settings import Settings
>>> home = pathlib.Path(tempfile.mkdtemp())
>>> _ = (home / "r.jsonl").write_text(
...     '{"event_id": "e1", "ts": 1700000000001, "user": 1, "item": 2, "rating": 5}\\n{"oops\\n')
>>> summary = ingest_files([home / "r.jsonl"], kind="rating",
...                        settings=Settings(home=home), progress=False)
>>> summary.events, summary.dead_letters
(Counter({'rating': 1}), Counter({'message': 1}))
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from pipeline.ingest.buffer import DEFAULT_MAX_MESSAGE_BYTES, PartitionBuffer
from pipeline.ingest.columns import Columns
from pipeline.ingest.ledger import FILE_TOPIC, contains, record_key
from pipeline.ingest.open_store import open_file_ledger, open_store
from pipeline.ingest.sources import Plan, plan_source, read_plan
from pipeline.ingest.store import EventStore, OverlapError, legacy_file_topic
from pipeline.ingest.summary import IngestSummary, progress_bar
from pipeline.ingest.validate import Limits


def ingest_files(paths: Iterable[str | Path], kind: str | None = None, *, settings=None,
                 store: EventStore | None = None, fmt: str | None = None,
                 columns: str | Columns | None = None, time_unit: str | None = None,
                 chunk_size: int = 100_000, progress: bool = True,
                 max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES) -> IngestSummary:
    """Validate events from files into the store (embedded mode, no Kafka).

    Records go to the store's file log (:data:`pipeline.ingest.ledger.FILE_TOPIC`), one durable
    segment group per chunk of records the store does not hold yet (by content): ingesting the
    same file again, a copy of it, or the file after a crash adds only what is not stored;
    after an edit, its changed and appended records. Records stored before and no longer in
    the file are counted in ``summary.removed`` (they stay in the store). The store may be
    local or an object store (:func:`pipeline.ingest.open_store.open_file_ledger`).

    Parameters
    ----------
    paths : iterable of path
        JSON lines, CSV with a header, Parquet, MovieLens ``u.data``, or SVMlight / LIBSVM /
        LETOR files.
    kind : str, optional
        Kind of events that carry no ``kind`` field (SVMlight: ``outcome`` or ``ordinal`` for
        lines without ``qid``; see :mod:`pipeline.ingest.svmlight`).
    settings : Settings, optional
        Where the store is (default ``Settings.load()``); or pass ``store``.
    fmt : str, optional
        One of :data:`pipeline.ingest.sources.FORMATS`; default from the file name.
    columns : str or Columns, optional
        CSV and Parquet: ``"user=userId,item=movieId,ts=timestamp"``, the column read as each
        event field (:mod:`pipeline.ingest.columns`).
    time_unit : str, optional
        Unit of a numeric ``ts``: ``"s"``, ``"ms"``, ``"us"``, ``"ns"`` or ``"auto"`` (the
        default with ``columns``; without either, ``ts`` is epoch ms).
    chunk_size : int
        Records per segment group.
    """
    started = time.monotonic()
    if not isinstance(columns, Columns):
        columns = Columns.parse(columns, time_unit)
    # a mistake about a source is refused before anything is stored
    plans = [check_source(path, fmt, kind, columns) for path in paths]
    settings = settings or _settings()
    store = store or open_store(settings)
    run = _Run(store, Limits.from_settings(settings), IngestSummary(unit="records"),
               chunk_size, max_message_bytes)
    try:
        with open_file_ledger(store) as run.ledger, progress_bar(progress, unit="rec") as run.bar:
            store.recover(FILE_TOPIC, 0)
            run.offset = store.next_offset(FILE_TOPIC, 0) or 0
            run.held = run.ledger.stored_keys(run.offset)
            for plan in plans:
                _ingest_file(run, plan)
    except OverlapError as err:       # an object store's commits, not a lock, fence writers
        raise ValueError(f"another ingest wrote files into {store.root} at the same time "
                         f"({err}): run this again; what either stored is kept, and nothing "
                         "is stored twice") from None
    run.summary.seconds = time.monotonic() - started
    run.summary.stopped = "all files read"
    return run.summary


@dataclass
class _Run:
    """One ingestion of files: where it writes, and what the store holds so far."""

    store: EventStore
    limits: Limits
    summary: IngestSummary
    chunk_size: int
    max_message_bytes: int
    ledger: object = None             # FileLedger or its object-store sibling
    bar: object = None
    offset: int = 0
    held: np.ndarray | None = None    # keys stored before this run, sorted
    added: set = field(default_factory=set)   # keys stored by this run


def _ingest_file(run: _Run, plan: Plan) -> None:
    """Store the records of one file that the store does not hold (module docstring)."""
    path, how, summary = plan.path, plan.key(), run.summary
    before = run.ledger.last_seen(path)
    legacy = _legacy_records(run.store, path) if before is None else 0
    keys_now, inherited = [], []
    for chunk in read_plan(plan, run.chunk_size):
        keys = [record_key(how + content) for content in chunk.contents]
        keys_now += keys
        old = [k for k, n in zip(keys, chunk.numbers) if n < legacy]
        inherited += old
        run.added.update(old)
        new = _new_records(keys, run.held, run.added)
        summary.messages += len(keys)
        summary.already_stored += len(keys) - len(new)
        run.bar.update(len(keys))
        if not new:
            continue
        chunk = chunk.take(new)
        offsets = range(run.offset, run.offset + len(new))
        run.ledger.add(run.offset, offsets[-1], [keys[i] for i in new])
        buf = PartitionBuffer(FILE_TOPIC, 0, plan.kind, run.max_message_bytes, run.limits)
        if chunk.lines is not None:
            buf.add_messages(chunk.lines, offsets)
        else:
            buf.add_rows(chunk.rows, offsets)
        summary.add(buf.flush(run.store))
        run.offset += len(new)
    summary.warnings += plan.notes
    if inherited:
        run.ledger.add_legacy(path, inherited)
    if before is not None:
        removed = int((~contains(np.unique(np.asarray(keys_now, np.uint64)), before)).sum())
        if removed:
            summary.removed.append(f"{path}: {removed:,}")
    run.ledger.remember(path, keys_now)


def _legacy_records(store: EventStore, path) -> int:
    """How many of ``path``'s first records a store written before the file ledger holds
    (under the file's own topic, record numbers as offsets): they count as stored."""
    return store.next_offset(legacy_file_topic(path), 0) or 0


def _new_records(keys: list[int], held: np.ndarray, added: set) -> list[int]:
    """Positions of the records whose key is neither in the store (``held``, sorted) nor
    added earlier in this run; adds them to ``added``."""
    known = contains(held, np.asarray(keys, np.uint64))
    new = []
    for i, key in enumerate(keys):
        if not known[i] and key not in added:
            added.add(key)
            new.append(i)
    return new


def check_source(path, fmt: str | None, kind: str | None,
                 columns: Columns | None = None) -> Plan:
    """How to read ``path`` (:func:`pipeline.ingest.sources.plan_source`), after refusing,
    before anything is read into the store, a source that cannot give events: a missing
    file, a format that cannot be told, an unknown ``kind``, a column mapping or time unit
    that does not fit the file, SVMlight labels that do not fit the kind, or records without
    a ``kind`` field when no default kind is given (every one would be a dead letter, and the
    file would count as consumed)."""
    from pipeline.ingest.events import KIND_NAMES

    kinds = ", ".join(KIND_NAMES)
    if kind is not None and kind not in KIND_NAMES:
        raise ValueError(f"unknown kind {kind!r}: give --kind one of {kinds}")
    path = Path(path)
    if not path.is_file():
        raise ValueError(f"{path}: no such file")
    plan = plan_source(path, fmt, kind, columns)
    if plan.kind is None and plan.fmt not in ("movielens", "svmlight") and not _has_kind(plan):
        raise ValueError(f"{path} has no 'kind' field and no --kind was given: add "
                         f"--kind KIND (one of {kinds}); nothing was ingested")
    missing = _missing_columns(plan)
    if missing:
        names = _column_names(plan)
        shown = ", ".join(names[:8]) + (", ..." if len(names) > 8 else "")
        raise ValueError(
            f"{path}: its header ({shown}) has no "
            f"{' or '.join(', '.join(repr(m) for m in missing).rsplit(', ', 1))} "
            f"column for {plan.kind} events, so every row would be a dead letter: name the "
            f"columns with --columns {','.join(f'{m}=COLUMN' for m in missing)}; nothing was "
            "ingested")
    return plan


def _column_names(plan: Plan) -> list[str]:
    """A CSV's or Parquet file's column names, as the column mapping renames them."""
    if plan.fmt == "csv":
        import csv

        with open(plan.path, newline="", encoding="utf-8", errors="replace") as fh:
            names = next(csv.reader(fh), [])
    else:
        import pyarrow.parquet as pq

        names = pq.ParquetFile(plan.path).schema_arrow.names
    return list(plan.columns.renamed(names) if plan.columns else names)


def _missing_columns(plan: Plan) -> list[str]:
    """The fields every event of the plan's kind needs that a CSV's or Parquet file's header
    lacks (none when its rows name their own kind, or for other formats); features are left
    to the row checks (a file may spell them in several ways)."""
    from pipeline.ingest.events import FEATURES, KINDS

    if plan.fmt not in ("csv", "parquet") or plan.kind not in KINDS:
        return []
    names = set(_column_names(plan))
    if "kind" in names:
        return []
    return [f.name for f in KINDS[plan.kind].fields
            if f.required and f.check != FEATURES and f.name not in names]


def _has_kind(plan: Plan) -> bool:
    """Whether the file's records can name their kind (its first one, for JSON lines)."""
    import json

    path, fmt = plan.path, plan.fmt
    if fmt in ("csv", "parquet"):
        return "kind" in _column_names(plan)
    if fmt == "jsonl":
        with open(path, "rb") as fh:
            first = next((line for line in fh if line.strip()), b"{}")
        try:
            record = json.loads(first)
        except ValueError:
            return True       # a malformed line is a dead letter, as always
        return not isinstance(record, dict) or "kind" in record
    return True


def _settings():
    from pipeline.settings import Settings

    return Settings.load()
