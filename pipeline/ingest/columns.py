"""Which column of a CSV or Parquet file holds which event field, and the unit of its event
times (``rankstream ingest --columns user=userId,item=movieId,ts=timestamp --time-unit s``).

A mapped column is read as the field it is mapped to (and no longer under its own name); the
other columns are read as they are named, so a file that already has ``event_id`` or ``kind``
columns keeps them. The mapping is checked against the file before anything is stored: a
column it names must be in the file, a field must belong to the events' kind, and every field
the kind needs must be there.

Event times are stored in epoch milliseconds. A numeric ``ts`` in another unit is converted by
``--time-unit``: ``s``, ``ms``, ``us``, ``ns``, or ``auto`` (the default once ``--columns`` is
given): the unit in which the values are dates between 1990 and 2100, ranges that do not
overlap across the four units. Seconds read as milliseconds is the classic mistake (every
event in January 1970), so a stated unit is checked against the first
:data:`SAMPLE_ROWS` values: a file whose times are dates only in another unit is refused with
one line that says what it saw and what to pass. ISO-8601 text and Parquet timestamp columns
carry their own unit.

MovieLens's own CSV release (``ratings.csv``: ``userId,movieId,rating,timestamp``, epoch
seconds) needs no flags: that exact header reads as rating events in seconds
(:data:`MOVIELENS_CSV`).

Examples
--------
>>> columns = Columns.parse("user=userId,item=movieId,ts=timestamp", "s")
>>> columns.apply({"userId": "1", "movieId": "31", "timestamp": 1260759144, "rating": "2.5"})
{'rating': '2.5', 'user': '1', 'item': '31', 'ts': 1260759144000}
>>> time_unit_of([881250949, 891717742]), time_unit_of([1700000000000])
('s', 'ms')
"""

from __future__ import annotations

import difflib
import json
from dataclasses import dataclass, replace
from datetime import date, datetime, timezone

from pipeline.ingest.events import KINDS
from pipeline.timestamps import parse_iso_ts

TIME_UNITS = ("s", "ms", "us", "ns", "auto")
UNIT_NAMES = {"s": "seconds", "ms": "milliseconds", "us": "microseconds", "ns": "nanoseconds"}
_INT_SCALE = {"s": (1000, 1), "ms": (1, 1), "us": (1, 1000), "ns": (1, 1_000_000)}
PLAUSIBLE_MS = (parse_iso_ts("1990-01-01"), parse_iso_ts("2100-01-01"))
SAMPLE_ROWS = 1000
COMMON_FIELDS = ("event_id", "ts", "kind")
MOVIELENS_CSV = ("userId", "movieId", "rating", "timestamp")


@dataclass(frozen=True)
class Columns:
    """A column mapping: ``fields`` pairs (event field, source column); ``time_unit`` the unit
    of a numeric ``ts`` (``None``: epoch ms as always; ``"auto"`` until :func:`resolve`)."""

    fields: tuple[tuple[str, str], ...] = ()
    time_unit: str | None = None

    @classmethod
    def parse(cls, text: str | None, time_unit: str | None = None) -> Columns | None:
        """The mapping of ``--columns FIELD=COLUMN,...`` and ``--time-unit`` (``None`` if
        neither is given); ``ValueError`` naming the part that does not read."""
        if time_unit is not None and time_unit not in TIME_UNITS:
            raise ValueError(f"--time-unit {time_unit!r}: expected one of "
                             f"{', '.join(TIME_UNITS)}")
        if text is None:
            return None if time_unit is None else cls((), time_unit)
        pairs = []
        for part in (p.strip() for p in text.split(",")):
            name, sep, column = (s.strip() for s in part.partition("="))
            if not (sep and name and column):
                raise ValueError(f"--columns: {part!r} is not FIELD=COLUMN (e.g. "
                                 "user=userId,item=movieId,rating=rating,ts=timestamp)")
            if name in dict(pairs):
                raise ValueError(f"--columns maps {name} twice")
            pairs.append((name, column))
        return cls(tuple(pairs), time_unit or "auto")

    @property
    def mapped(self) -> dict[str, str]:
        return dict(self.fields)

    def key(self) -> str:
        """How it reads a file, for the file ledger: another mapping reads other events."""
        return json.dumps([list(map(list, self.fields)), self.time_unit])

    def apply(self, row: dict) -> dict:
        """A source row as event fields: :meth:`rename`, then :meth:`times`."""
        return self.times(self.rename(row))

    def rename(self, row: dict) -> dict:
        """Mapped columns under their fields' names; the other columns as they are."""
        sources = {column for _, column in self.fields}
        out = {k: v for k, v in row.items() if k not in sources}
        for name, column in self.fields:
            if column in row:
                out[name] = row[column]
        return out

    def renamed(self, names) -> set[str]:
        """The field names the columns ``names`` are read as."""
        sources = {column for _, column in self.fields}
        return ({name for name, column in self.fields if column in names}
                | (set(names) - sources))

    def times(self, row: dict) -> dict:
        """The row with its ``ts`` in epoch ms (a number read in :attr:`time_unit`)."""
        if "ts" in row:
            row["ts"] = to_ms(row["ts"], self.time_unit)
        return row


def to_ms(value, unit: str | None):
    """An event time in epoch ms: a number in ``unit`` converted (integers exactly), a
    datetime (naive: UTC) or date converted; anything else as it is, for validation to name.

    >>> to_ms(881250949, "s"), to_ms(1.5, "s"), to_ms(1700000000000123, "us")
    (881250949000, 1500, 1700000000000)
    """
    if isinstance(value, datetime):
        moment = value if value.tzinfo else value.replace(tzinfo=timezone.utc)
        return int(moment.timestamp() * 1000)
    if isinstance(value, date):
        return to_ms(datetime(value.year, value.month, value.day), unit)
    if unit is None or unit == "auto" or type(value) not in (int, float):
        return value
    up, down = _INT_SCALE[unit]
    if type(value) is int:
        return value * up // down
    if value != value or value in (float("inf"), float("-inf")):
        return value
    return round(value * up / down)


def _unit_fitting(value) -> str | None:
    """The unit in which a number is a date in 1990..2100 (at most one: the ranges of the
    four units do not overlap)."""
    for unit in UNIT_NAMES:
        ms = to_ms(value, unit)
        if type(ms) is int and PLAUSIBLE_MS[0] <= ms < PLAUSIBLE_MS[1]:
            return unit
    return None


def time_unit_of(values) -> str | None:
    """The one unit in which the numbers among ``values`` are dates (``None``: none, or
    several)."""
    units = {_unit_fitting(v) for v in values if type(v) in (int, float)}
    return units.pop() if len(units) == 1 else None


def _when(value, unit: str) -> str:
    ms = to_ms(value, unit)
    try:
        return datetime.fromtimestamp(ms / 1000, tz=timezone.utc).strftime("%Y-%m-%d")
    except (OverflowError, OSError, ValueError):
        return "no date"


def check_time_unit(stated: str | None, values: list, where: str, column: str) -> str | None:
    """The unit to read ``column``'s numbers in: ``stated``, checked against a sample of its
    ``values``, or for ``"auto"`` the one the values fit; ``ValueError`` in one line when the
    values say otherwise or nothing can tell."""
    numbers = [v for v in values if type(v) in (int, float)]
    if stated is None or not numbers:
        return None if stated == "auto" else stated
    fitting = {}
    for value in numbers:
        fitting.setdefault(_unit_fitting(value), value)
    units = [u for u in UNIT_NAMES if u in fitting]
    flags = " or ".join(f"--time-unit {u}" for u in units)
    if stated != "auto":
        if stated in fitting or not units:
            return stated
        value = fitting[units[0]]
        raise ValueError(
            f"{where}: column {column!r} holds epoch {UNIT_NAMES[units[0]]} ({value} is "
            f"{_when(value, units[0])} in {UNIT_NAMES[units[0]]}, {_when(value, stated)} in "
            f"{UNIT_NAMES[stated]}), not the {UNIT_NAMES[stated]} that --time-unit {stated} "
            f"says: pass {flags}")
    if len(units) == 1:
        return units[0]
    if units:
        seen = ", ".join(f"{UNIT_NAMES[u]} ({fitting[u]})" for u in units)
        raise ValueError(f"{where}: column {column!r} mixes epoch {seen}: pass {flags} for "
                         "the unit meant (times in another become dead letters)")
    raise ValueError(f"{where}: cannot tell the unit of column {column!r}: {numbers[0]} is no "
                     "date between 1990 and 2100 in s, ms, us or ns; pass --time-unit")


def _did_you_mean(name: str, names: list[str]) -> str:
    lower = {n.lower(): n for n in names}
    close = lower.get(name.lower()) or next(iter(difflib.get_close_matches(name, names, 1)), None)
    return f" (did you mean {close!r}?)" if close else ""


def resolve(columns: Columns | None, names: list[str], kind: str | None, where: str,
            ts_sample=None) -> tuple[Columns | None, str | None]:
    """The mapping to read a file with columns ``names`` by, checked, its time unit decided
    from ``ts_sample()`` (the first values of the column that is read as ``ts``), and the kind
    of its events (MovieLens's header: ``rating``). ``ValueError`` in one line on a mistake."""
    if columns is None or not columns.fields:
        if tuple(names) == MOVIELENS_CSV and kind in (None, "rating"):
            unit = "s" if columns is None else columns.time_unit     # a stated one is checked
            columns, kind = Columns((("user", "userId"), ("item", "movieId"),
                                     ("ts", "timestamp")), unit), "rating"
        elif columns is None:
            return None, kind
    listed = ", ".join(names)
    for name, column in columns.fields:
        if column not in names:
            raise ValueError(f"{where}: --columns maps {name} to {column!r}, which the file "
                             f"does not have{_did_you_mean(column, names)}; its columns: "
                             f"{listed}")
    fields = _fields(kind)
    for name, _ in columns.fields:
        if name not in fields:
            raise ValueError(f"{where}: --columns names {name!r}, not a field of "
                             f"{kind or 'any'} events{_did_you_mean(name, list(fields))}; "
                             f"the fields: {', '.join(fields)}")
    read_as = columns.renamed(names)
    if kind is not None and "kind" not in read_as:
        for f in KINDS[kind].fields:
            if f.required and f.name not in read_as:
                raise ValueError(f"{where}: {kind} events need {f.name!r} and no column is "
                                 f"read as it (its columns: {listed}): add {f.name}=COLUMN "
                                 "to --columns")
    ts_column = columns.mapped.get("ts", "ts")
    if columns.time_unit is not None and ts_column in names and ts_sample is not None:
        unit = check_time_unit(columns.time_unit, ts_sample(ts_column), where, ts_column)
        columns = replace(columns, time_unit=unit)
    elif columns.time_unit == "auto":
        columns = replace(columns, time_unit=None)
    return columns, kind


def _fields(kind: str | None) -> dict[str, None]:
    """The fields a mapping may name: the common ones and the kind's (any kind's if none)."""
    kinds = [KINDS[kind]] if kind in KINDS else list(KINDS.values())
    names = list(COMMON_FIELDS) + [f.name for k in kinds for f in k.fields]
    return dict.fromkeys(names)
