"""Validate events in batches, with a precise reason for every rejected event.

:func:`validate_rows` takes decoded events (dicts, as from JSON messages), groups them by kind
and hands each group to :func:`validate_columns`, which checks whole columns at once: the common
case (every value of a column has the right type and range) costs a few C-level passes
(``set(map(type, col))``, ``numpy.array``) instead of Python code per event, and only columns
that fail the fast check are walked value by value. Those per-value checks (:func:`check_event`
applies them to one event) are the reference the fast path is tested against.

Reasons name the kind, the field and the value, e.g.
``"rating: field 'rating' is 'five', expected a number"``,
``"comparison: winner == loser == 'i42'"``, ``"judgment: features: index -3 < 0"``,
``"unknown kind 'click' (expected comparison, interaction, judgment, ordinal, outcome
or rating)"``.

Examples
--------
>>> import numpy as np
>>> from pipeline.ingest.validate import check_event, validate_rows
>>> check_event({"kind": "rating", "event_id": "e1", "ts": 1700000000005, "user": 1, "item": "a",
...              "rating": "five"})
"rating: field 'rating' is 'five', expected a number"
>>> tables, bad = validate_rows(
...     [{"event_id": "e1", "ts": 1700000000005, "user": 1, "item": "a", "rating": 4.5},
...      {"event_id": "e2", "ts": 1700000000006, "user": 2, "item": "a", "rating": "five"}],
...     np.array([10, 11]), default_kind="rating")
>>> tables["rating"].column("user").to_pylist(), bad
(['1'], {1: "rating: field 'rating' is 'five', expected a number"})
"""

from __future__ import annotations

import math
import re
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from itertools import chain

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from pipeline.ingest.events import (
    BINARY,
    FEATURE_COLUMNS,
    FEATURES,
    GRADE,
    ID,
    KIND_NAMES,
    KINDS,
    MAX_ABS_NUMBER,
    MAX_FEATURE_INDEX,
    MAX_ID_CHARS,
    MAX_TS_MS,
    MIN_EVENT_TIME,
    NUMBER,
    ORDINAL,
    TEXT,
    parse_iso_ts,
)


class _Missing:
    def __repr__(self):
        return "MISSING"


MISSING = _Missing()      # a field the event does not have
_MISSING_TYPES = (type(MISSING), type(None))
_INT32_MAX = 2**31 - 1
_KIND_LIST = ", ".join(KIND_NAMES[:-1]) + " or " + KIND_NAMES[-1]
# Declared label ranges: a relevance grade's gain 2^grade - 1 stays finite and meaningful; no
# star scale has a thousand levels (a model's own ``levels`` narrows it when its data is read).
LABEL_RANGE = {GRADE: (0, 100), ORDINAL: (1, 1000), BINARY: (0, 1)}
_CONTROL = re.compile("[\x00-\x1f\x7f]")  # C0 controls and DEL: never in an id
_EXPECTED = {ID: "a string or an integer", NUMBER: "a number", TEXT: "a string",
             GRADE: "an integer >= 0", ORDINAL: "an integer >= 1", BINARY: "0 or 1"}


class Invalid(ValueError):
    """Raised by the per-value checks; ``str(err)`` is the reason."""


@dataclass(frozen=True)
class Limits:
    """Bounds that belong to a deployment rather than to the event schema (``Settings``:
    ``RANKSTREAM_MAX_FUTURE_SECONDS``, ``RANKSTREAM_MAX_FEATURE_INDEX``).

    ``min_ts``: an earlier event time (epoch ms) is refused: ``0`` is a "no time" default, and
    epoch *seconds* read as milliseconds fall in January 1970. ``future_seconds``: an event
    time more than this far ahead of the ingesting machine's clock is refused (one event
    dated 9999-12-31 would otherwise be the newest event of every ``last_days`` window
    forever). ``max_feature_index``: larger feature indices are refused (a
    single index of 2^31 - 1 would make every model of those events allocate gigabytes).
    """

    future_seconds: float = 86_400.0
    max_feature_index: int = 2**24 - 1
    min_ts: int = parse_iso_ts(MIN_EVENT_TIME)

    @classmethod
    def from_settings(cls, settings) -> Limits:
        return cls(future_seconds=float(settings.max_future_seconds),
                   max_feature_index=int(settings.max_feature_index),
                   min_ts=parse_iso_ts(settings.min_event_time))

    def max_ts(self) -> int:
        """The largest event time (epoch ms) accepted now."""
        return min(MAX_TS_MS, int((time.time() + self.future_seconds) * 1000))


DEFAULT_LIMITS = Limits()


def show(value) -> str:
    """How a value is quoted in a reason: strings quoted (and shortened), JSON words for
    null/true/false, numbers as written, containers by type."""
    if isinstance(value, str):
        return repr(value if len(value) <= 40 else value[:37] + "...")
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int) and value.bit_length() > 128:
        return f"an integer of {value.bit_length()} bits"
    if isinstance(value, (int, float)):
        text = repr(value)
        return text if len(text) <= 40 else text[:37] + "..."
    if isinstance(value, list):
        return "a list"
    if isinstance(value, dict):
        return "a map"
    return f"a {type(value).__name__}"


# ---------------------------------------------------------------- per-value checks (reference)

def _field_error(kind: str, name: str, value, expected: str) -> Invalid:
    if value is MISSING or value is None:     # null counts as absent (a batch's nil is absent)
        return Invalid(f"{kind}: missing field '{name}'")
    return Invalid(f"{kind}: field '{name}' is {show(value)}, expected {expected}")


def _check_text(kind: str, name: str, value, is_id: bool) -> str:
    if type(value) is int and is_id:
        if value.bit_length() > 64:
            raise Invalid(f"{kind}: field '{name}' is {show(value)}, expected an integer of "
                          "at most 64 bits or a string")
        return str(value)
    if type(value) is not str:
        raise _field_error(kind, name, value, _EXPECTED[ID] if is_id else "a string")
    if is_id and not value:
        raise Invalid(f"{kind}: field '{name}' is empty")
    if is_id and len(value) > MAX_ID_CHARS:
        raise Invalid(f"{kind}: field '{name}' is {len(value)} characters long, "
                      f"over {MAX_ID_CHARS}")
    if is_id and (bad := _CONTROL.search(value)):
        raise Invalid(f"{kind}: field '{name}' contains the control character "
                      f"U+{ord(bad.group()):04X} at position {bad.start()}; ids cannot hold "
                      "control characters")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as err:
        raise Invalid(f"{kind}: field '{name}' is not valid Unicode (a lone surrogate at "
                      f"position {err.start})") from None
    return value


def check_event_id(kind: str, value) -> str:
    if type(value) is not str:
        raise _field_error(kind, "event_id", value, "a string")
    return _check_text(kind, "event_id", value, is_id=True)


def check_ts(kind: str, value, max_ts: int = MAX_TS_MS, min_ts: int = 0) -> int:
    if type(value) is int:
        ms = value
    elif type(value) is str:
        try:
            ms = parse_iso_ts(value)
        except (ValueError, OverflowError):
            raise Invalid(f"{kind}: field 'ts' is {show(value)}, not an ISO-8601 time") from None
    else:
        raise _field_error(kind, "ts", value, "epoch milliseconds or an ISO-8601 string")
    if ms < 0:
        raise Invalid(f"{kind}: field 'ts' is {show(value)}, before 1970-01-01 (epoch ms)")
    if ms < min_ts:
        raise Invalid(f"{kind}: field 'ts' is {show(value)}, before "
                      f"{_iso(min_ts).replace('T00:00:00+00:00', '')}, the "
                      "earliest time accepted (RANKSTREAM_MIN_EVENT_TIME)"
                      + ("; ts is epoch milliseconds, not seconds" if type(value) is int else ""))
    if ms > max_ts:
        raise Invalid(f"{kind}: field 'ts' is {show(value)}, after {_iso(max_ts)}: more than "
                      "the allowed clock skew in the future (RANKSTREAM_MAX_FUTURE_SECONDS)")
    return ms


def _iso(ms: int) -> str:
    from datetime import datetime, timezone

    return datetime.fromtimestamp(ms / 1000, tz=timezone.utc).isoformat(timespec="seconds")


def check_number(kind: str, name: str, value) -> float:
    if type(value) is not int and type(value) is not float:
        raise _field_error(kind, name, value, "a number")
    try:
        number = float(value)
    except OverflowError:
        number = math.inf
    if not math.isfinite(number):
        raise Invalid(f"{kind}: field '{name}' is {show(value)}, expected a finite number")
    if abs(number) > MAX_ABS_NUMBER:
        raise Invalid(f"{kind}: field '{name}' is {show(value)}, beyond ±{MAX_ABS_NUMBER:g}, "
                      "the largest magnitude accepted")
    return number


def check_label(kind: str, name: str, value, check: str) -> int:
    if type(value) is not int:
        raise _field_error(kind, name, value, "0 or 1" if check == BINARY else "an integer")
    low, high = LABEL_RANGE[check]
    if value < low or value > high:
        expected = _EXPECTED[check] if value < low or check == BINARY else f"an integer <= {high}"
        raise Invalid(f"{kind}: field '{name}' is {show(value)}, expected {expected}")
    return value


def check_features(kind: str, value, max_index: int = MAX_FEATURE_INDEX
                   ) -> tuple[list[int], list[float]]:
    """``(indices, values)`` of a dense list or a sparse ``{index: value}`` map, sorted."""
    if type(value) is list:
        if len(value) > max_index + 1:
            raise Invalid(f"{kind}: features: a dense list of {len(value)} values, more than "
                          f"the limit of {max_index + 1} (RANKSTREAM_MAX_FEATURE_INDEX)")
        values = [_feature_value(kind, v, f"position {i}") for i, v in enumerate(value)]
        return list(range(len(values))), values
    if type(value) is not dict:
        raise _field_error(kind, "features", value, "a list or a map")
    pairs = []
    for key, v in value.items():
        index = _feature_index(kind, key, max_index)
        pairs.append((index, _feature_value(kind, v, f"index {index}")))
    pairs.sort()
    for (a, _), (b, _) in zip(pairs, pairs[1:]):
        if a == b:
            raise Invalid(f"{kind}: features: index {a} appears twice")
    return [i for i, _ in pairs], [v for _, v in pairs]


def _feature_index(kind: str, key, max_index: int) -> int:
    if type(key) is str:
        digits = key[1:] if key[:1] == "-" else key
        if not (digits.isascii() and digits.isdigit()):
            raise Invalid(f"{kind}: features: index {show(key)} is not an integer")
        if len(digits) > 18:
            raise Invalid(f"{kind}: features: index {show(key)} > {max_index}, the limit "
                          "(RANKSTREAM_MAX_FEATURE_INDEX)")
        key = int(key)
    elif type(key) is not int:
        raise Invalid(f"{kind}: features: index {show(key)} is not an integer")
    if key < 0:
        raise Invalid(f"{kind}: features: index {key} < 0")
    if key > max_index:
        raise Invalid(f"{kind}: features: index {key} > {max_index}, the limit "
                      "(RANKSTREAM_MAX_FEATURE_INDEX)")
    return key


def _feature_value(kind: str, value, where: str) -> float:
    if type(value) is not int and type(value) is not float:
        raise Invalid(f"{kind}: features: value at {where} is {show(value)}, expected a number")
    try:
        number = float(value)
    except OverflowError:
        number = math.inf
    if not math.isfinite(number):
        raise Invalid(f"{kind}: features: value at {where} is {show(value)}, "
                      "expected a finite number")
    if abs(number) > MAX_ABS_NUMBER:
        raise Invalid(f"{kind}: features: value at {where} is {show(value)}, beyond "
                      f"±{MAX_ABS_NUMBER:g}, the largest magnitude accepted")
    return number


def resolve_kind(event, default_kind: str | None) -> str:
    """The kind of a decoded event (its ``kind`` field, else ``default_kind``)."""
    if type(event) is not dict:
        raise Invalid(f"event is {show(event)}, expected an object")
    kind = event.get("kind", default_kind)
    if kind is None:
        raise Invalid("missing field 'kind' and no default kind for this source (give --kind)")
    if type(kind) is not str:
        raise Invalid(f"field 'kind' is {show(kind)}, expected a string")
    if kind not in KINDS:
        raise Invalid(f"unknown kind {show(kind)} (expected {_KIND_LIST})")
    return kind


def normalize_event(event, default_kind: str | None = None,
                    limits: Limits = DEFAULT_LIMITS) -> dict:
    """The event as it will be stored (ids as strings, ts in ms, features as index/value
    lists), checked value by value; raises :class:`Invalid` with the first problem found.

    This is the plain reference implementation; :func:`validate_columns` must agree with it.
    """
    kind = resolve_kind(event, default_kind)
    get = event.get
    out = {"kind": kind, "event_id": check_event_id(kind, get("event_id", MISSING)),
           "ts": check_ts(kind, get("ts", MISSING), limits.max_ts(), limits.min_ts)}
    for f in KINDS[kind].fields:
        value = get(f.name, MISSING)
        if not f.required and type(value) in _MISSING_TYPES:
            if f.check == FEATURES:
                out["feature_index"], out["feature_value"] = [], []
            else:
                out[f.name] = None
        elif f.check == ID:
            out[f.name] = _check_text(kind, f.name, value, is_id=True)
        elif f.check == TEXT:
            out[f.name] = _check_text(kind, f.name, value, is_id=False)
        elif f.check == NUMBER:
            out[f.name] = check_number(kind, f.name, value)
        elif f.check == FEATURES:
            out["feature_index"], out["feature_value"] = check_features(
                kind, value, limits.max_feature_index)
        else:
            out[f.name] = check_label(kind, f.name, value, f.check)
    _check_across_fields(kind, out, get)
    return out


def _check_across_fields(kind: str, out: dict, get) -> None:
    if kind == "comparison" and out["winner"] == out["loser"]:
        raise Invalid(f"comparison: winner == loser == {show(out['winner'])}")
    if kind == "ordinal" and type(get("features")) in _MISSING_TYPES \
            and type(get("text")) in _MISSING_TYPES:
        raise Invalid("ordinal: needs 'features' or 'text'")


def check_event(event, default_kind: str | None = None,
                limits: Limits = DEFAULT_LIMITS) -> str | None:
    """The reason ``event`` is invalid, or ``None`` if it is valid."""
    try:
        normalize_event(event, default_kind, limits)
    except Invalid as err:
        return str(err)
    return None


# ---------------------------------------------------------------- column checks (fast path)

def validate_rows(rows: Sequence, offsets: np.ndarray, default_kind: str | None = None,
                  limits: Limits = DEFAULT_LIMITS
                  ) -> tuple[dict[str, pa.Table], dict[int, str]]:
    """Validate decoded events; returns ``({kind: table of the valid ones}, {row: reason})``.

    ``offsets[i]`` is stored as the ``offset`` of row ``i``.
    """
    bad: dict[int, str] = {}
    by_kind: dict[str, list[int]] = {}
    kinds = [r.get("kind", default_kind) if type(r) is dict else None for r in rows]
    kinds = [k if type(k) is str else None for k in kinds]  # a list or map is no kind
    unique = set(kinds)
    if len(unique) == 1 and (only := unique.pop()) in KINDS:
        by_kind[only] = list(range(len(rows)))
    else:
        for i, (row, kind) in enumerate(zip(rows, kinds)):
            if type(kind) is str and kind in KINDS:
                by_kind.setdefault(kind, []).append(i)
            else:
                try:
                    resolve_kind(row, default_kind)
                except Invalid as err:
                    bad[i] = str(err)
    tables = {}
    for kind, index in by_kind.items():
        group = rows if len(index) == len(rows) else [rows[i] for i in index]
        names = ("event_id", "ts") + KINDS[kind].field_names
        columns = {name: [r.get(name, MISSING) for r in group] for name in names}
        table, group_bad = validate_columns(kind, columns, len(group), offsets[index], limits)
        tables[kind] = table
        bad.update((index[i], reason) for i, reason in group_bad.items())
    return tables, bad


def validate_columns(kind: str, columns: Mapping[str, list], n: int, offsets: np.ndarray,
                     limits: Limits = DEFAULT_LIMITS) -> tuple[pa.Table, dict[int, str]]:
    """Validate ``n`` events of one kind given as column lists (a value that is absent is
    :data:`MISSING` or ``None``); returns the table of valid events and ``{row: reason}``.
    """
    spec = KINDS[kind]
    bad: dict[int, str] = {}

    def column(name):
        values = columns.get(name)
        return [MISSING] * n if values is None else values

    arrays = {"event_id": _ids(kind, "event_id", column("event_id"), bad, event_id=True),
              "ts": _timestamps(kind, column("ts"), bad, limits.max_ts(), limits.min_ts),
              "offset": pa.array(np.asarray(offsets, dtype=np.int64))}
    for f in spec.fields:
        values = column(f.name)
        if f.check == ID:
            arrays[f.name] = _ids(kind, f.name, values, bad)
        elif f.check == NUMBER:
            arrays[f.name] = _numbers(kind, f.name, values, bad)
        elif f.check == FEATURES:
            arrays["feature_index"], arrays["feature_value"] = _features(
                kind, values, bad, f.required, limits.max_feature_index)
        elif f.check == TEXT:
            arrays[f.name] = _texts(kind, f.name, values, bad)
        else:
            arrays[f.name] = _labels(kind, f.name, values, f.check, bad)
    if kind == "comparison":
        same = pc.and_(pc.equal(arrays["winner"], arrays["loser"]),
                       pc.not_equal(arrays["winner"], ""))
        for i in np.flatnonzero(same.to_numpy(zero_copy_only=False)).tolist():
            bad.setdefault(i, f"comparison: winner == loser == {show(arrays['winner'][i].as_py())}")
    if kind == "ordinal":
        features, text = column("features"), column("text")
        for i in range(n):
            if type(features[i]) in _MISSING_TYPES and type(text[i]) in _MISSING_TYPES:
                bad.setdefault(i, "ordinal: needs 'features' or 'text'")
    table = pa.Table.from_pydict(arrays, schema=spec.schema)
    if bad:
        keep = np.ones(n, dtype=bool)
        keep[list(bad)] = False
        table = table.filter(keep)
    return table, bad


def _slow(values, check, placeholder, bad: dict) -> list:
    out = []
    append = out.append
    for i, value in enumerate(values):
        try:
            append(check(value))
        except Invalid as err:
            bad.setdefault(i, str(err))
            append(placeholder)
    return out


def _ids(kind: str, name: str, values: list, bad: dict, event_id: bool = False) -> pa.Array:
    types = set(map(type, values))
    try:
        if (types == {str} and all(values) and max(map(len, values)) <= MAX_ID_CHARS
                and not _CONTROL.search("".join(values))):
            return pa.array(values, pa.string())
        if types == {int} and not event_id:
            return pa.array(np.array(values, dtype=np.int64)).cast(pa.string())
    except (UnicodeEncodeError, OverflowError):
        pass
    if event_id:
        return pa.array(_slow(values, lambda v: check_event_id(kind, v), "", bad), pa.string())
    return pa.array(_slow(values, lambda v: _check_text(kind, name, v, True), "", bad),
                    pa.string())


def _texts(kind: str, name: str, values: list, bad: dict) -> pa.Array:
    def check(value):
        return None if type(value) in _MISSING_TYPES else _check_text(kind, name, value, False)
    return pa.array(_slow(values, check, None, bad), pa.string())


def _timestamps(kind: str, values: list, bad: dict, max_ts: int, min_ts: int) -> pa.Array:
    if set(map(type, values)) == {int}:
        try:
            ts = np.array(values, dtype=np.int64)
        except OverflowError:
            ts = None
        if ts is not None and ts.size and max(0, min_ts) <= ts.min() and ts.max() <= max_ts:
            return pa.array(ts)
    return pa.array(_slow(values, lambda v: check_ts(kind, v, max_ts, min_ts), 0, bad),
                    pa.int64())


def _numbers(kind: str, name: str, values: list, bad: dict) -> pa.Array:
    if set(map(type, values)) <= {int, float}:
        try:
            numbers = np.array(values, dtype=np.float64)
        except OverflowError:
            numbers = None
        if numbers is not None and in_range(numbers):
            return pa.array(numbers)
    return pa.array(_slow(values, lambda v: check_number(kind, name, v), 0.0, bad), pa.float64())


def in_range(numbers: np.ndarray) -> bool:
    """Whether every number is within ±MAX_ABS_NUMBER (NaN is not)."""
    return bool((np.abs(numbers) <= MAX_ABS_NUMBER).all())


def _labels(kind: str, name: str, values: list, check: str, bad: dict) -> pa.Array:
    low, high = LABEL_RANGE[check]
    if set(map(type, values)) == {int}:
        try:
            labels = np.array(values, dtype=np.int64)
        except OverflowError:
            labels = None
        if labels is not None and labels.size and low <= labels.min() and labels.max() <= high:
            return pa.array(labels.astype(np.int32))
    return pa.array(_slow(values, lambda v: check_label(kind, name, v, check), low, bad),
                    pa.int32())


def _features(kind: str, values: list, bad: dict, required: bool, max_index: int
              ) -> tuple[pa.Array, pa.Array]:
    n = len(values)
    types = set(map(type, values))
    fast = None
    if types == {list}:
        fast = _dense_fast(values, max_index)
    elif types == {dict}:
        fast = _sparse_fast(values, max_index)
    if fast is not None:
        offsets, indices, numbers = fast
    else:
        def check(value):
            if not required and type(value) in _MISSING_TYPES:
                return [], []
            return check_features(kind, value, max_index)
        pairs = _slow(values, check, ([], []), bad)
        lengths = np.fromiter((len(p[0]) for p in pairs), np.int64, n)
        offsets = np.zeros(n + 1, dtype=np.int64)
        np.cumsum(lengths, out=offsets[1:])
        indices = np.fromiter(chain.from_iterable(p[0] for p in pairs), np.int64, offsets[-1])
        numbers = np.fromiter(chain.from_iterable(p[1] for p in pairs), np.float64, offsets[-1])
    (_, index_type), (_, value_type) = FEATURE_COLUMNS
    offsets32 = pa.array(offsets.astype(np.int32))
    return (pa.ListArray.from_arrays(offsets32, pa.array(indices.astype(np.int32)),
                                     type=index_type),
            pa.ListArray.from_arrays(offsets32, pa.array(numbers), type=value_type))


def _row_offsets(lengths: np.ndarray) -> np.ndarray:
    offsets = np.zeros(len(lengths) + 1, dtype=np.int64)
    np.cumsum(lengths, out=offsets[1:])
    return offsets


def _dense_fast(values: list, max_index: int):
    if max(map(len, values), default=0) > max_index + 1:
        return None
    flat = list(chain.from_iterable(values))
    if not set(map(type, flat)) <= {int, float}:
        return None
    try:
        numbers = np.array(flat, dtype=np.float64)
    except OverflowError:
        return None
    if not in_range(numbers):
        return None
    offsets = _row_offsets(np.fromiter(map(len, values), np.int64, len(values)))
    lengths = np.diff(offsets)
    indices = np.arange(offsets[-1], dtype=np.int64) - np.repeat(offsets[:-1], lengths)
    return offsets, indices, numbers


def _sparse_fast(values: list, max_index: int):
    keys = list(chain.from_iterable(values))
    key_types = set(map(type, keys))
    if key_types == {str}:
        if (not all(map(str.isdigit, keys)) or not all(map(str.isascii, keys))
                or max(map(len, keys)) > 18):
            return None
        keys = list(map(int, keys))
    elif key_types and key_types != {int}:
        return None
    flat = list(chain.from_iterable(map(dict.values, values)))
    if not set(map(type, flat)) <= {int, float}:
        return None
    try:
        indices = np.array(keys, dtype=np.int64)
        numbers = np.array(flat, dtype=np.float64)
    except OverflowError:
        return None
    if indices.size and (indices.min() < 0 or indices.max() > max_index):
        return None
    if not in_range(numbers):
        return None
    offsets = _row_offsets(np.fromiter(map(len, values), np.int64, len(values)))
    rows = np.repeat(np.arange(len(values)), np.diff(offsets))
    order = np.lexsort((indices, rows))
    indices, numbers = indices[order], numbers[order]
    if indices.size > 1 and ((rows[1:] == rows[:-1]) & (indices[1:] == indices[:-1])).any():
        return None     # a repeated index ("3" and "03"): the slow path names it
    return offsets, indices, numbers
