"""Events from files, for runs without Kafka: JSON lines, CSV with a header, Parquet,
MovieLens ``u.data``, and SVMlight / LIBSVM / LETOR text (:mod:`pipeline.ingest.svmlight`).

Each record comes with its 0-based number in the file (JSON lines: line number; CSV: data row
after the header; Parquet and MovieLens: row) and its content as bytes (the line, the CSV
cells with their header, the Parquet row as JSON), from which the file ledger keys it
(:mod:`pipeline.ingest.ledger`): ingesting a file again stores only what is new or changed.

Parquet columns keep their types (a ``map<int, double>`` column holds sparse features; a
text ``features`` column is parsed as JSON). CSV cells are text: the fields of the event's kind
that hold numbers (``ts``, ``rating``, ``label``) are converted when they parse as numbers
(otherwise they stay text and validation says why the event is rejected), ``features`` is
parsed as JSON, empty cells count as missing; a plain ``user,item,rating`` CSV (or Parquet)
without ``event_id`` (or ``ts``) gets ids derived from each row's content
(:func:`with_derived_ids`).
Ids stay text. A CSV record the csv module cannot read (a cell over 128 KiB, a broken quote)
is a :class:`Malformed` record: one dead letter, and the rest of the file is read. CSV and
Parquet columns can be mapped onto event fields, with the unit of their times
(:mod:`pipeline.ingest.columns`; MovieLens's ``ratings.csv`` header is recognised as it is).
:func:`plan_source` decides, once per file, how it is read (:class:`Plan`).

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

from pipeline.ingest import svmlight
from pipeline.ingest.columns import SAMPLE_ROWS, Columns, resolve, to_ms
from pipeline.ingest.dead_letters import Malformed
from pipeline.ingest.events import FEATURES, ID, KINDS, TEXT

FORMATS = ("jsonl", "csv", "parquet", "movielens", "svmlight")


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
    """The format of a file from its name (``u.data`` / ``*.data`` is MovieLens), or for a
    name that does not say (LETOR's ``train.txt``, LIBSVM's ``a9a``) SVMlight if its first
    record reads as such.

    >>> detect_format("events.jsonl"), detect_format("u.data"), detect_format("x.parquet")
    ('jsonl', 'movielens', 'parquet')
    """
    name = Path(path).name.lower()
    for suffix, fmt in ((".jsonl", "jsonl"), (".ndjson", "jsonl"), (".json", "jsonl"),
                        (".csv", "csv"), (".parquet", "parquet"), (".data", "movielens"),
                        (".svm", "svmlight"), (".svmlight", "svmlight"),
                        (".libsvm", "svmlight")):
        if name.endswith(suffix):
            return fmt
    if Path(path).is_file() and svmlight.looks_like_svmlight(path):
        return "svmlight"
    raise ValueError(f"cannot tell the format of {path!s} from its name: pass --format "
                     f"(one of {', '.join(FORMATS)})")


@dataclass(frozen=True)
class Plan:
    """How one file is read: its format, the kind of its records (the default kind; for
    SVMlight, the kind its labels and ``--kind`` decided) and its column mapping."""

    path: Path
    fmt: str
    kind: str | None
    columns: Columns | None = None
    # what reading it found odd (a CSV: rows without a time, records spanning many lines)
    notes: list = field(default_factory=list, compare=False)

    def key(self) -> bytes:
        """How its records are read, for the file ledger's keys: the same record read another
        way is another event."""
        mapping = f"{self.columns.key()}|" if self.columns is not None else ""
        return f"{self.fmt}|{self.kind or ''}|{mapping}".encode()


def plan_source(path: str | Path, fmt: str | None = None, kind: str | None = None,
                columns: Columns | None = None) -> Plan:
    """How to read ``path`` (:class:`Plan`); ``ValueError`` in one line for a format, kind,
    mapping or time unit that does not fit the file, before anything is read into a store."""
    path = Path(path)
    fmt = fmt or detect_format(path)
    if fmt not in FORMATS:
        raise ValueError(f"unknown file format {fmt!r}; expected one of {', '.join(FORMATS)}")
    if columns is not None and fmt not in ("csv", "parquet"):
        raise ValueError(f"{path}: --columns and --time-unit apply to CSV and Parquet files, "
                         f"and this one is read as {fmt}")
    if fmt == "svmlight":
        return Plan(path, fmt, svmlight.file_kind(path, kind))
    if fmt == "csv":
        columns, kind = resolve(columns, _csv_header(path), kind, str(path),
                                lambda name: _csv_sample(path, name))
    elif fmt == "parquet":
        import pyarrow.parquet as pq

        columns, kind = resolve(columns, pq.ParquetFile(path).schema_arrow.names, kind,
                                str(path), lambda name: _parquet_sample(path, name))
    return Plan(path, fmt, kind, columns)


def read_chunks(path: str | Path, fmt: str | None = None, kind: str | None = None,
                chunk_size: int = 100_000, columns: Columns | None = None) -> Iterator[Chunk]:
    """The records of a file, ``chunk_size`` at a time.

    ``kind`` is the default kind (used to convert CSV cells; MovieLens is always ``rating``);
    ``columns`` maps CSV or Parquet columns onto event fields.
    """
    return read_plan(plan_source(path, fmt, kind, columns), chunk_size)


def read_plan(plan: Plan, chunk_size: int = 100_000) -> Iterator[Chunk]:
    """The records of a planned file (:func:`plan_source`), ``chunk_size`` at a time."""
    fmt = plan.fmt
    readers = {"jsonl": _jsonl, "csv": _csv, "parquet": _parquet, "movielens": _movielens,
               "svmlight": _svmlight}

    def fresh() -> Chunk:
        return Chunk(lines=[] if fmt == "jsonl" else None, rows=None if fmt == "jsonl" else [])

    chunk = fresh()
    extra = {"notes": plan.notes} if fmt == "csv" else {}
    for number, content, record in readers[fmt](plan.path, plan.kind, plan.columns, **extra):
        chunk.numbers.append(number)
        chunk.contents.append(content)
        chunk.records().append(record)
        if len(chunk.numbers) >= chunk_size:
            yield chunk
            chunk = fresh()
    if chunk.numbers:
        yield chunk


def _svmlight(path: Path, kind, columns):
    return svmlight.read_records(path, kind)


def _jsonl(path: Path, kind, columns):
    with open(path, "rb") as fh:
        for number, line in enumerate(fh):
            if line.strip():
                line = line.rstrip(b"\r\n")
                yield number, line, line


def _csv_header(path: Path) -> list[str]:
    with open(path, newline="", encoding="utf-8", errors="surrogateescape") as fh:
        try:
            return next(csv.reader(fh), [])
        except csv.Error:
            return []


def _csv_sample(path: Path, column: str) -> list:
    """The first values of a CSV column, numbers converted."""
    values = []
    with open(path, newline="", encoding="utf-8", errors="surrogateescape") as fh:
        reader = csv.DictReader(fh)
        try:
            for _, row in zip(range(SAMPLE_ROWS), reader):
                if row.get(column) not in ("", None):
                    values.append(_number(row[column]))
        except csv.Error:
            pass                     # what the sample saw so far; the record is a dead letter
    return values


def _parquet_sample(path: Path, column: str) -> list:
    import pyarrow.parquet as pq

    for batch in pq.ParquetFile(path).iter_batches(batch_size=SAMPLE_ROWS, columns=[column]):
        return [v for v in batch.column(0).to_pylist() if v is not None]
    return []


def _csv(path: Path, kind, columns, notes: list | None = None):
    """Records after the header; a record the csv module cannot read (a cell over its 128 KiB
    field limit, a broken quote) is a :class:`Malformed` record, and reading goes on. What
    was odd goes to ``notes`` at the end, one line each: rows without a time (they get the
    file's modification time), and far fewer records than lines (a quote left open makes one
    record of every line up to the next quote), with the line of the longest record."""
    default_ts = int(path.stat().st_mtime * 1000)
    no_time, longest = 0, (0, 0)      # rows without ts; (lines, first line) of the longest
    with open(path, newline="", encoding="utf-8", errors="surrogateescape") as fh:
        reader = csv.reader(fh)
        header = next(reader, None)
        if header is None:
            return
        number = 0
        while True:
            start = reader.line_num + 1
            try:
                cells = next(reader)
            except StopIteration:
                _csv_notes(notes, path, reader.line_num, number, no_time, longest)
                return
            except csv.Error as err:
                reason = f"CSV record on line {reader.line_num}: {err}"
                yield number, reason.encode(), Malformed(reason)
                number += 1
                continue
            if reader.line_num - start + 1 > longest[0]:
                longest = (reader.line_num - start + 1, start)
            if cells:
                content = json.dumps(sorted(zip(header, cells))).encode()   # ASCII escapes
                row = dict(zip(header, cells))
                if columns is None:
                    row = coerce_text_row(row, kind)
                else:           # names mapped first, so that cells convert for their field
                    row = columns.times(coerce_text_row(columns.rename(row), kind))
                no_time += "ts" not in row
                yield number, content, with_derived_ids(row, default_ts)
            number += bool(cells)


SPAN_SHARE = 0.5   # records under this share of a CSV's lines: say where a record spans lines


def _csv_notes(notes, path, lines: int, records: int, no_time: int, longest: tuple) -> None:
    """The odd things :func:`_csv` found, as lines for the ingest summary."""
    if notes is None:
        return
    if no_time:
        notes.append(f"{path}: {no_time:,} of {records:,} records have no time and got the "
                     "file's modification time: add a ts column, or map one with --columns "
                     "ts=COLUMN")
    if lines > 10 and records < SPAN_SHARE * (lines - 1) and longest[0] > 1:
        notes.append(f"{path}: {lines - 1:,} lines after the header made {records:,} records: "
                     f"the record from line {longest[1]:,} spans {longest[0]:,} lines (a quote "
                     "left open?)")


def _parquet(path: Path, kind, columns):
    import pyarrow as pa
    import pyarrow.parquet as pq

    source = pq.ParquetFile(path)
    maps = {f.name for f in source.schema_arrow if pa.types.is_map(f.type)}
    if columns is not None:
        maps = columns.renamed(maps)
    number, default_ts = 0, int(path.stat().st_mtime * 1000)
    for batch in source.iter_batches(batch_size=65_536):
        for row in batch.to_pylist():
            content = json.dumps(row, sort_keys=True, default=str).encode()
            if columns is not None:
                row = columns.apply(row)
            yield number, content, with_derived_ids(_parquet_row(row, maps), default_ts)
            number += 1


def _parquet_row(row: dict, maps: set) -> dict:
    """Nulls dropped, Arrow maps (lists of pairs) as dicts, JSON text features parsed, a
    timestamp ``ts`` in epoch ms."""
    out = {k: v for k, v in row.items() if v is not None}
    if "ts" in out and not isinstance(out["ts"], (int, float, str)):
        out["ts"] = to_ms(out["ts"], None)
    for name in maps & out.keys():
        out[name] = dict(out[name])
    if type(out.get("features")) is str:
        try:
            out["features"] = json.loads(out["features"])
        except ValueError:
            pass
    return out


def _movielens(path: Path, kind, columns):
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
