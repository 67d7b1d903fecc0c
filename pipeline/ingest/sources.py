"""Events from files, for runs without Kafka: JSON lines, CSV with a header, Parquet, and
MovieLens ``u.data``.

Each record comes with its 0-based number in the file (JSON lines: line number; CSV: data row
after the header; Parquet and MovieLens: row) and its content as bytes (the line, the CSV
cells with their header, the Parquet row as JSON), from which the file ledger keys it
(:mod:`pipeline.ingest.ledger`): ingesting a file again stores only what is new or changed.

Parquet columns keep their types (a ``map<int, double>`` column holds sparse features; a
text ``features`` column is parsed as JSON). CSV cells are text: the fields of the event's kind
that hold numbers (``ts``, ``rating``, ``label``) are converted when they parse as numbers
(otherwise they stay text and validation says why the event is rejected), ``features`` is
parsed as JSON, empty cells count as missing; a plain ``user,item,rating`` CSV without
``event_id`` (or ``ts``) gets ids derived from each row's content (:func:`with_derived_ids`).
Ids stay text. A CSV record the csv module cannot read (a cell over 128 KiB, a broken quote)
is a :class:`Malformed` record: one dead letter, and the rest of the file is read.

Examples
--------
>>> import tempfile, pathlib
>>> from pipeline.ingest.sources import read_chunks
>>> path = pathlib.Path(tempfile.mkdtemp()) / "ratings.csv"
>>> _ = path.write_text("event_id,ts,user,item,rating\\ne1,1000,u1,i1,4.5\\n")
>>> chunk = next(read_chunks(path, kind="rating"))
>>> chunk.numbers, chunk.rows
([0], [{'event_id': 'e1', 'ts': 1000, 'user': 'u1', 'item': 'i1', 'rating': 4.5}])
"""

from __future__ import annotations

import csv
import json
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from pipeline.ingest.dead_letters import Malformed
from pipeline.ingest.events import FEATURES, ID, KINDS, TEXT

FORMATS = ("jsonl", "csv", "parquet", "movielens")


@dataclass
class Chunk:
    """Records ``numbers`` of a file: raw ``lines`` (JSON lines) or decoded ``rows``, and the
    ``contents`` the ledger keys them by."""

    numbers: list[int] = field(default_factory=list)
    contents: list[bytes] = field(default_factory=list)
    lines: list[bytes] | None = None
    rows: list[dict] | None = None

    def records(self) -> list:
        return self.lines if self.lines is not None else self.rows

    def take(self, keep) -> "Chunk":
        """The records at positions ``keep``."""
        def pick(values):
            return None if values is None else [values[i] for i in keep]

        return Chunk(pick(self.numbers), pick(self.contents), pick(self.lines), pick(self.rows))


def detect_format(path: str | Path) -> str:
    """The format of a file from its name: ``u.data`` / ``*.data`` is MovieLens.

    >>> detect_format("events.jsonl"), detect_format("u.data"), detect_format("x.parquet")
    ('jsonl', 'movielens', 'parquet')
    """
    name = Path(path).name.lower()
    for suffix, fmt in ((".jsonl", "jsonl"), (".ndjson", "jsonl"), (".json", "jsonl"),
                        (".csv", "csv"), (".parquet", "parquet"), (".data", "movielens")):
        if name.endswith(suffix):
            return fmt
    raise ValueError(f"cannot tell the format of {path!s} from its name: pass --format "
                     f"(one of {', '.join(FORMATS)})")


def read_chunks(path: str | Path, fmt: str | None = None, kind: str | None = None,
                chunk_size: int = 100_000) -> Iterator[Chunk]:
    """The records of a file, ``chunk_size`` at a time.

    ``kind`` is the default kind (used to convert CSV cells; MovieLens is always ``rating``).
    """
    fmt = fmt or detect_format(path)
    readers = {"jsonl": _jsonl, "csv": _csv, "parquet": _parquet, "movielens": _movielens}
    if fmt not in readers:
        raise ValueError(f"unknown file format {fmt!r}; expected one of {', '.join(FORMATS)}")

    def fresh() -> Chunk:
        return Chunk(lines=[] if fmt == "jsonl" else None, rows=None if fmt == "jsonl" else [])

    chunk = fresh()
    for number, content, record in readers[fmt](Path(path), kind):
        chunk.numbers.append(number)
        chunk.contents.append(content)
        chunk.records().append(record)
        if len(chunk.numbers) >= chunk_size:
            yield chunk
            chunk = fresh()
    if chunk.numbers:
        yield chunk


def _jsonl(path: Path, kind):
    with open(path, "rb") as fh:
        for number, line in enumerate(fh):
            if line.strip():
                line = line.rstrip(b"\r\n")
                yield number, line, line


def _csv(path: Path, kind):
    """Records after the header; a record the csv module cannot read (a cell over its 128 KiB
    field limit, a broken quote) is a :class:`Malformed` record, and reading goes on."""
    default_ts = int(path.stat().st_mtime * 1000)
    with open(path, newline="", encoding="utf-8", errors="surrogateescape") as fh:
        reader = csv.reader(fh)
        header = next(reader, None)
        if header is None:
            return
        number = 0
        while True:
            try:
                cells = next(reader)
            except StopIteration:
                return
            except csv.Error as err:
                reason = f"CSV record on line {reader.line_num}: {err}"
                yield number, reason.encode(), Malformed(reason)
                number += 1
                continue
            if cells:
                content = json.dumps(sorted(zip(header, cells))).encode()   # ASCII escapes
                yield number, content, with_derived_ids(
                    coerce_text_row(dict(zip(header, cells)), kind), default_ts)
            number += bool(cells)


def _parquet(path: Path, kind):
    import pyarrow as pa
    import pyarrow.parquet as pq

    source = pq.ParquetFile(path)
    maps = {f.name for f in source.schema_arrow if pa.types.is_map(f.type)}
    number = 0
    for batch in source.iter_batches(batch_size=65_536):
        for row in batch.to_pylist():
            content = json.dumps(row, sort_keys=True, default=str).encode()
            yield number, content, _parquet_row(row, maps)
            number += 1


def _parquet_row(row: dict, maps: set) -> dict:
    """Nulls dropped, Arrow maps (lists of pairs) as dicts, JSON text features parsed."""
    out = {k: v for k, v in row.items() if v is not None}
    for name in maps & out.keys():
        out[name] = dict(out[name])
    if type(out.get("features")) is str:
        try:
            out["features"] = json.loads(out["features"])
        except ValueError:
            pass
    return out


def _movielens(path: Path, kind):
    """MovieLens ``u.data``: ``user item rating timestamp`` (tab separated, seconds)."""
    with open(path, encoding="latin-1") as fh:
        for number, line in enumerate(fh):
            if line.strip():
                yield number, line.rstrip("\r\n").encode("latin-1"), movielens_event(line)


def movielens_event(line: str) -> dict:
    """One ``u.data`` line as a rating event; the event id is ``ml:<user>:<item>`` (MovieLens
    has one rating per user and item), ``ts`` seconds become milliseconds. Malformed lines give
    events that fail validation with a reason.

    >>> event = movielens_event("196\\t242\\t3\\t881250949\\n")
    >>> event["event_id"], event["ts"], event["user"], event["rating"]
    ('ml:196:242', 881250949000, '196', 3)
    """
    parts = line.rstrip("\r\n").split("\t")
    user, item, rating, seconds = (parts + [""] * 4)[:4]
    event = {"kind": "rating", "event_id": f"ml:{user}:{item}", "user": user, "item": item,
             "rating": _number(rating), "ts": _number(seconds)}
    if type(event["ts"]) is int:
        event["ts"] *= 1000
    return {k: v for k, v in event.items() if v != ""}


def convert_movielens(src: str | Path, dst: str | Path) -> int:
    """Write MovieLens ``u.data`` as rating events in JSON lines (``dst``); returns the count."""
    count = 0
    with open(src, encoding="latin-1") as fin, open(dst, "w", encoding="utf-8") as fout:
        for line in fin:
            if line.strip():
                fout.write(json.dumps(movielens_event(line)) + "\n")
                count += 1
    return count


def coerce_text_row(row: dict, kind: str | None) -> dict:
    """A CSV row (all text) with numbers and features converted for its kind (see above)."""
    out = {k: v for k, v in row.items() if k is not None and v not in ("", None)}
    spec = KINDS.get(out.get("kind", kind))
    checks = {f.name: f.check for f in spec.fields} if spec else {}
    for name, value in out.items():
        check = checks.get(name)
        if name == "ts" or (check is not None and check not in (ID, TEXT, FEATURES)):
            out[name] = _number(value)
        elif check == FEATURES:
            try:
                out[name] = json.loads(value)
            except ValueError:
                pass
    return out


def with_derived_ids(row: dict, default_ts: int) -> dict:
    """A row without ``event_id`` gets one derived from its content (``d-`` and 16 hex digits
    of BLAKE2b over its fields, sorted), so the same record always has the same id and a
    re-read stores nothing twice; a row without ``ts`` gets ``default_ts`` (the file's
    modification time), which is not part of the id.

    >>> a = with_derived_ids({"user": "u1", "item": "i1", "rating": 4}, 1000)
    >>> a["event_id"] == with_derived_ids({"rating": 4, "item": "i1", "user": "u1"}, 5)["event_id"]
    True
    >>> a["ts"], with_derived_ids({"event_id": "e1", "ts": 7}, 1000)
    (1000, {'event_id': 'e1', 'ts': 7})
    """
    if "event_id" in row and "ts" in row:
        return row
    out = dict(row)
    if "event_id" not in out:
        from hashlib import blake2b

        content = json.dumps(sorted((str(k), str(v)) for k, v in row.items()))
        out["event_id"] = "d-" + blake2b(content.encode(), digest_size=8).hexdigest()
    out.setdefault("ts", default_ts)
    return out


def _number(text: str):
    """``int`` or ``float`` if ``text`` parses as one, else ``text`` unchanged."""
    try:
        return int(text)
    except ValueError:
        pass
    try:
        return float(text)
    except ValueError:
        return text
