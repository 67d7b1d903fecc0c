"""File ingestion (embedded mode, no Kafka): JSON lines, CSV, Parquet or MovieLens files are
validated into the same event store as Kafka messages, each file under its own synthetic topic
with record numbers as offsets, so ingesting a file again adds only what is new.

Examples
--------
>>> import tempfile, pathlib
>>> from pipeline.ingest.files import ingest_files
>>> from pipeline.settings import Settings
>>> home = pathlib.Path(tempfile.mkdtemp())
>>> _ = (home / "r.jsonl").write_text(
...     '{"event_id": "e1", "ts": 1, "user": 1, "item": 2, "rating": 5}\\n{"oops\\n')
>>> summary = ingest_files([home / "r.jsonl"], kind="rating",
...                        settings=Settings(home=home), progress=False)
>>> summary.events, summary.dead_letters
(Counter({'rating': 1}), Counter({'message': 1}))
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from pathlib import Path

from pipeline.ingest.buffer import (
    DEFAULT_MAX_MESSAGE_BYTES,
    IngestSummary,
    PartitionBuffer,
    progress_bar,
)
from pipeline.ingest.sources import read_chunks
from pipeline.ingest.store import EventStore, file_source_topic
from pipeline.ingest.validate import Limits


def ingest_files(paths: Iterable[str | Path], kind: str | None = None, *, settings=None,
                 store: EventStore | None = None, fmt: str | None = None,
                 chunk_size: int = 100_000, progress: bool = True,
                 max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES) -> IngestSummary:
    """Validate events from files into the store (embedded mode, no Kafka).

    Each file is its own source (:func:`pipeline.ingest.store.file_source_topic`) with record
    numbers as offsets, written one durable segment group per chunk, so ingesting the same file
    again (or after a crash) adds only the records not yet stored.

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
    store = store or EventStore.from_settings(settings)
    limits = Limits.from_settings(settings)
    summary = IngestSummary(unit="records")
    with progress_bar(progress, unit="rec") as bar:
        for path in paths:
            topic = file_source_topic(path)
            store.recover(topic, 0)
            start = store.next_offset(topic, 0) or 0
            for chunk in read_chunks(path, fmt, kind, start, chunk_size):
                buf = PartitionBuffer(topic, 0, kind, max_message_bytes, limits)
                if chunk.lines is not None:
                    buf.add_messages(chunk.lines, chunk.offsets)
                else:
                    buf.add_rows(chunk.rows, chunk.offsets)
                summary.add(buf.flush(store))
                summary.messages += len(chunk.offsets)
                bar.update(len(chunk.offsets))
    summary.seconds = time.monotonic() - started
    summary.stopped = "all files read"
    return summary


def check_source(path, fmt: str | None, kind: str | None) -> None:
    """Refuse, before anything is read into the store, a source that cannot give events: a
    missing file, a format that cannot be told, an unknown ``kind``, or records without a
    ``kind`` field when no default kind is given (every one would be a dead letter, and the
    file would count as consumed)."""
    import json

    from pipeline.ingest.events import KIND_NAMES
    from pipeline.ingest.sources import detect_format

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
