"""File ingestion (embedded mode, no Kafka): JSON lines, CSV, Parquet or MovieLens files are
validated into the same event store as Kafka messages, appended to one log of file records
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
from pathlib import Path

import numpy as np

from pipeline.ingest.buffer import (
    DEFAULT_MAX_MESSAGE_BYTES,
    IngestSummary,
    PartitionBuffer,
    progress_bar,
)
from pipeline.ingest.ledger import FILE_TOPIC, FileLedger, contains, record_key
from pipeline.ingest.open_store import open_store
from pipeline.ingest.sources import detect_format, read_chunks
from pipeline.ingest.store import EventStore, legacy_file_topic
from pipeline.ingest.validate import Limits


def ingest_files(paths: Iterable[str | Path], kind: str | None = None, *, settings=None,
                 store: EventStore | None = None, fmt: str | None = None,
                 chunk_size: int = 100_000, progress: bool = True,
                 max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES) -> IngestSummary:
    """Validate events from files into the store (embedded mode, no Kafka).

    Records go to the store's file log (:data:`pipeline.ingest.ledger.FILE_TOPIC`), one durable
    segment group per chunk of records the store does not hold yet (by content): ingesting the
    same file again, a copy of it, or the file after a crash adds only what is not stored;
    after an edit, its changed and appended records. Records stored before and no longer in
    the file are counted in ``summary.removed`` (they stay in the store).

    Parameters
    ----------
    paths : iterable of path
        JSON lines, CSV with a header, Parquet, or MovieLens ``u.data`` files.
    kind : str, optional
        Kind of events that carry no ``kind`` field.
    settings : Settings, optional
        Where the store is (default ``Settings.load()``); or pass ``store``.
    fmt : str, optional
        ``"jsonl"``, ``"csv"``, ``"parquet"`` or ``"movielens"``; default from the file name.
    chunk_size : int
        Records per segment group.
    """
    started = time.monotonic()
    paths = list(paths)
    for path in paths:      # a mistake about a source is refused before anything is stored
        check_source(path, fmt, kind)
    settings = settings or _settings()
    store = store or open_store(settings)
    if store.filesystem is not None:
        raise ValueError(f"files are ingested into a local store only, and the store is "
                         f"{store.root}: send them through Kafka (rankstream produce), or "
                         "unset RANKSTREAM_STORE to ingest them locally")
    limits = Limits.from_settings(settings)
    summary = IngestSummary(unit="records")
    ledger = FileLedger(store.root)
    with store.lock(f"{FILE_TOPIC}.ingest", 0), progress_bar(progress, unit="rec") as bar:
        store.recover(FILE_TOPIC, 0)
        offset = store.next_offset(FILE_TOPIC, 0) or 0
        held, added = ledger.stored_keys(offset), set()
        for path in paths:
            how = f"{fmt or detect_format(path)}|{kind or ''}|".encode()
            before = ledger.last_seen(path)
            legacy = _legacy_records(store, path) if before is None else 0
            keys_now, inherited = [], []
            for chunk in read_chunks(path, fmt, kind, chunk_size):
                keys = [record_key(how + content) for content in chunk.contents]
                keys_now += keys
                old = [k for k, n in zip(keys, chunk.numbers) if n < legacy]
                inherited += old
                added.update(old)
                new = _new_records(keys, held, added)
                summary.messages += len(keys)
                summary.already_stored += len(keys) - len(new)
                bar.update(len(keys))
                if not new:
                    continue
                chunk = chunk.take(new)
                offsets = range(offset, offset + len(new))
                ledger.add(offset, offsets[-1], [keys[i] for i in new])
                buf = PartitionBuffer(FILE_TOPIC, 0, kind, max_message_bytes, limits)
                if chunk.lines is not None:
                    buf.add_messages(chunk.lines, offsets)
                else:
                    buf.add_rows(chunk.rows, offsets)
                summary.add(buf.flush(store))
                offset += len(new)
            if inherited:
                ledger.add_legacy(path, inherited)
            if before is not None:
                removed = int((~contains(np.unique(np.asarray(keys_now, np.uint64)),
                                         before)).sum())
                if removed:
                    summary.removed.append(f"{path}: {removed:,}")
            ledger.remember(path, keys_now)
    summary.seconds = time.monotonic() - started
    summary.stopped = "all files read"
    return summary


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


def check_source(path, fmt: str | None, kind: str | None) -> None:
    """Refuse, before anything is read into the store, a source that cannot give events: a
    missing file, a format that cannot be told, an unknown ``kind``, or records without a
    ``kind`` field when no default kind is given (every one would be a dead letter, and the
    file would count as consumed)."""
    import json

    from pipeline.ingest.events import KIND_NAMES

    kinds = ", ".join(KIND_NAMES)
    if kind is not None and kind not in KIND_NAMES:
        raise ValueError(f"unknown kind {kind!r}: give --kind one of {kinds}")
    path = Path(path)
    if not path.is_file():
        raise ValueError(f"{path}: no such file")
    fmt = fmt or detect_format(path)
    if kind is not None or fmt == "movielens":
        return
    has_kind = True
    if fmt == "csv":
        import csv

        with open(path, newline="", encoding="utf-8", errors="replace") as fh:
            has_kind = "kind" in next(csv.reader(fh), [])
    elif fmt == "parquet":
        import pyarrow.parquet as pq

        has_kind = "kind" in pq.ParquetFile(path).schema_arrow.names
    elif fmt == "jsonl":
        with open(path, "rb") as fh:
            first = next((line for line in fh if line.strip()), b"{}")
        try:
            record = json.loads(first)
        except ValueError:
            return       # a malformed line is a dead letter, as always
        has_kind = not isinstance(record, dict) or "kind" in record
    if not has_kind:
        raise ValueError(f"{path} has no 'kind' field and no --kind was given: add "
                         f"--kind KIND (one of {kinds}); nothing was ingested")


def _settings():
    from pipeline.settings import Settings

    return Settings.load()
