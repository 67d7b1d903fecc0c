"""Validate events in batches, with a precise reason for every rejected event.

:func:`validate_rows` takes decoded events (dicts, as from JSON messages), groups them by kind
and hands each group to :func:`validate_columns`, which checks whole columns at once: the common
case (every value of a column has the right type and range) costs a few C-level passes
(``set(map(type, col))``, ``numpy.array``) instead of Python code per event, and only columns
that fail the fast check are walked value by value, by the per-value checks of
:mod:`pipeline.ingest.event_checks` (:func:`check_event` applies them to one event): the
reference the fast path is tested against.

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

from collections.abc import Mapping, Sequence
from itertools import chain

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from pipeline.ingest.event_checks import (
    CONTROL_CHARS,
    DEFAULT_LIMITS,
    LABEL_RANGE,
    MISSING_TYPES,
    Limits,
    check_event,
    check_event_id,
    check_label,
    check_number,
    check_text,
    check_ts,
    normalize_event,
    resolve_kind,
)
from pipeline.ingest.events import (
    FEATURE_COLUMNS,
    FEATURES,
    ID,
    KINDS,
    MAX_ID_CHARS,
    MAX_TS_MS,
    NUMBER,
    TEXT,
)
from pipeline.value_checks import MAX_ABS_NUMBER, MISSING, Invalid, check_features, show

# The per-event checks are part of this module's interface, so that importers of validation
# need one module.
__all__ = ["DEFAULT_LIMITS", "LABEL_RANGE", "MAX_TS_MS", "MISSING", "Invalid", "Limits",
           "check_event", "check_features", "in_range", "normalize_event", "resolve_kind",
           "show", "validate_columns", "validate_rows"]


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
            if type(features[i]) in MISSING_TYPES and type(text[i]) in MISSING_TYPES:
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
                and not CONTROL_CHARS.search("".join(values))):
            return pa.array(values, pa.string())
        if types == {int} and not event_id:
            return pa.array(np.array(values, dtype=np.int64)).cast(pa.string())
    except (UnicodeEncodeError, OverflowError):
        pass
    if event_id:
        return pa.array(_slow(values, lambda v: check_event_id(kind, v), "", bad), pa.string())
    return pa.array(_slow(values, lambda v: check_text(kind, name, v, True), "", bad),
                    pa.string())


def _texts(kind: str, name: str, values: list, bad: dict) -> pa.Array:
    def check(value):
        return None if type(value) in MISSING_TYPES else check_text(kind, name, value, False)
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
            if not required and type(value) in MISSING_TYPES:
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
