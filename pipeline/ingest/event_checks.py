"""Per-event checks: the reference rules of validation, one value at a time.

:func:`normalize_event` turns one decoded event into what the store keeps (ids as strings,
``ts`` in ms, features as index/value lists) or raises :class:`Invalid` with the first problem;
:func:`check_event` gives that reason or ``None``. The column-wise fast path of
:mod:`pipeline.ingest.validate` falls back on these checks for the values it cannot pass in bulk,
and is tested against them.

Examples
--------
>>> from pipeline.ingest.event_checks import check_event
>>> check_event({"kind": "comparison", "event_id": "e1", "ts": 1700000000005, "user": 1,
...              "winner": "i42", "loser": "i42"})
"comparison: winner == loser == 'i42'"
"""

from __future__ import annotations

import math
import re
import time
from dataclasses import dataclass

from pipeline.ingest.events import (
    BINARY,
    FEATURES,
    GRADE,
    ID,
    KIND_NAMES,
    KINDS,
    MAX_ID_CHARS,
    MAX_TS_MS,
    MIN_EVENT_TIME,
    NUMBER,
    ORDINAL,
    TEXT,
)
from pipeline.timestamps import parse_iso_ts
from pipeline.value_checks import (
    MAX_ABS_NUMBER,
    MISSING,
    Invalid,
    check_features,
    field_error,
    show,
)

MISSING_TYPES = (type(MISSING), type(None))
_KIND_LIST = ", ".join(KIND_NAMES[:-1]) + " or " + KIND_NAMES[-1]
# Declared label ranges: a relevance grade's gain 2^grade - 1 stays finite and meaningful; no
# star scale has a thousand levels (a model's own ``levels`` narrows it when its data is read).
LABEL_RANGE = {GRADE: (0, 100), ORDINAL: (1, 1000), BINARY: (0, 1)}
CONTROL_CHARS = re.compile("[\x00-\x1f\x7f]")  # C0 controls and DEL: never in an id
_EXPECTED = {ID: "a string or an integer", NUMBER: "a number", TEXT: "a string",
             GRADE: "an integer >= 0", ORDINAL: "an integer >= 1", BINARY: "0 or 1"}


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


def check_text(kind: str, name: str, value, is_id: bool) -> str:
    if type(value) is int and is_id:
        if value.bit_length() > 64:
            raise Invalid(f"{kind}: field '{name}' is {show(value)}, expected an integer of "
                          "at most 64 bits or a string")
        return str(value)
    if type(value) is not str:
        raise field_error(kind, name, value, _EXPECTED[ID] if is_id else "a string")
    if is_id and not value:
        raise Invalid(f"{kind}: field '{name}' is empty")
    if is_id and len(value) > MAX_ID_CHARS:
        raise Invalid(f"{kind}: field '{name}' is {len(value)} characters long, "
                      f"over {MAX_ID_CHARS}")
    if is_id and (bad := CONTROL_CHARS.search(value)):
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
        raise field_error(kind, "event_id", value, "a string")
    return check_text(kind, "event_id", value, is_id=True)


def check_ts(kind: str, value, max_ts: int = MAX_TS_MS, min_ts: int = 0) -> int:
    if type(value) is int:
        ms = value
    elif type(value) is str:
        try:
            ms = parse_iso_ts(value)
        except (ValueError, OverflowError):
            raise Invalid(f"{kind}: field 'ts' is {show(value)}, not an ISO-8601 time") from None
    else:
        raise field_error(kind, "ts", value, "epoch milliseconds or an ISO-8601 string")
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
        raise field_error(kind, name, value, "a number")
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
        raise field_error(kind, name, value, "0 or 1" if check == BINARY else "an integer")
    low, high = LABEL_RANGE[check]
    if value < low or value > high:
        expected = _EXPECTED[check] if value < low or check == BINARY else f"an integer <= {high}"
        raise Invalid(f"{kind}: field '{name}' is {show(value)}, expected {expected}")
    return value


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
        if not f.required and type(value) in MISSING_TYPES:
            if f.check == FEATURES:
                out["feature_index"], out["feature_value"] = [], []
            else:
                out[f.name] = None
        elif f.check == ID:
            out[f.name] = check_text(kind, f.name, value, is_id=True)
        elif f.check == TEXT:
            out[f.name] = check_text(kind, f.name, value, is_id=False)
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
    if kind == "ordinal" and type(get("features")) in MISSING_TYPES \
            and type(get("text")) in MISSING_TYPES:
        raise Invalid("ordinal: needs 'features' or 'text'")


def check_event(event, default_kind: str | None = None,
                limits: Limits = DEFAULT_LIMITS) -> str | None:
    """The reason ``event`` is invalid, or ``None`` if it is valid."""
    try:
        normalize_event(event, default_kind, limits)
    except Invalid as err:
        return str(err)
    return None
