"""The six event kinds: their fields, how each field is checked, and their Arrow schemas.

Every event is a JSON object (or msgpack map) with the common fields

``kind``      one of :data:`KIND_NAMES`; may be left out when the topic or file has a default kind
``event_id``  non-empty string, unique per event (the producer's id; the store never invents one)
``ts``        event time: integer epoch **milliseconds**, or an ISO-8601 string
              (``"2024-05-01T12:00:00Z"``; a naive time is taken as UTC); stored as int64 ms.
              From 1990-01-01 (``RANKSTREAM_MIN_EVENT_TIME``; so ``0``, a "no time" default,
              and epoch *seconds* are refused) to a day past the ingesting machine's clock.

and the fields of its kind:

============  ===================================================================
rating        ``user`` id, ``item`` id, ``rating`` number within ±1e15
interaction   ``user`` id, ``item`` id, optional ``action`` string (view, click, purchase)
comparison    ``user`` id, ``winner`` id, ``loser`` id (winner != loser)
judgment      ``query`` id, ``doc`` id, ``label`` integer >= 0, ``features``
outcome       ``item`` id, ``label`` 0 or 1, ``features``
ordinal       ``item`` id, ``label`` integer >= 1, ``features`` and/or ``text`` string
============  ===================================================================

Ids are strings or integers as the producer sends them and are **stored as strings**:
``42`` and ``"42"`` are the same id. Features are a dense list ``[0.5, 0, 1.2]`` or a sparse
map ``{"3": 0.5, "17": 1.0}`` (JSON keys are strings; msgpack may use integer keys); both are
stored sparse, as ``feature_index`` (int32, ascending within an event, at most
``RANKSTREAM_MAX_FEATURE_INDEX``) and ``feature_value`` (float64, within ±1e15) list columns,
so a dense list of n values becomes indices 0..n-1. Fields that are not listed are ignored.
Every stored row also carries ``offset``: the Kafka offset of the message that carried it (or
its append position in the file log, for file sources).

Examples
--------
>>> from pipeline.ingest.events import KINDS, schema
>>> KINDS["comparison"].field_names
('user', 'winner', 'loser')
>>> schema("rating").names
['event_id', 'ts', 'offset', 'user', 'item', 'rating']
"""

from __future__ import annotations

from dataclasses import dataclass

import pyarrow as pa

# Re-exported: ingest's names for the bounds and the time parser it shares with the bottom layer.
from pipeline.timestamps import parse_iso_ts  # noqa: F401
from pipeline.value_checks import MAX_ABS_NUMBER, MAX_FEATURE_INDEX  # noqa: F401

# Field checks, by name (see pipeline.ingest.validate for the exact rules and reasons).
ID, NUMBER, GRADE, BINARY, ORDINAL, FEATURES, TEXT = (
    "id", "number", "grade", "binary", "ordinal", "features", "text")

MAX_ID_CHARS = 512                 # longer ids and event_ids are rejected
MAX_TS_MS = 253402300799999        # 9999-12-31T23:59:59.999Z
MIN_EVENT_TIME = "1990-01-01"      # the earliest event time accepted by default

_ARROW_TYPES = {
    ID: pa.string(), NUMBER: pa.float64(), GRADE: pa.int32(), BINARY: pa.int32(),
    ORDINAL: pa.int32(), TEXT: pa.string(),
}
FEATURE_COLUMNS = (("feature_index", pa.list_(pa.int32())),
                   ("feature_value", pa.list_(pa.float64())))
COMMON_COLUMNS = (("event_id", pa.string()), ("ts", pa.int64()), ("offset", pa.int64()))


@dataclass(frozen=True)
class Field:
    name: str
    check: str            # one of ID, NUMBER, GRADE, BINARY, ORDINAL, FEATURES, TEXT
    required: bool = True


@dataclass(frozen=True)
class Kind:
    """One event kind: its name, its fields (besides event_id and ts) and its Arrow schema."""

    name: str
    fields: tuple[Field, ...]

    @property
    def field_names(self) -> tuple[str, ...]:
        return tuple(f.name for f in self.fields)

    @property
    def schema(self) -> pa.Schema:
        columns = list(COMMON_COLUMNS)
        for f in self.fields:
            columns.extend(FEATURE_COLUMNS if f.check == FEATURES
                           else [(f.name, _ARROW_TYPES[f.check])])
        return pa.schema(columns)


KINDS: dict[str, Kind] = {k.name: k for k in (
    Kind("rating", (Field("user", ID), Field("item", ID), Field("rating", NUMBER))),
    Kind("comparison", (Field("user", ID), Field("winner", ID), Field("loser", ID))),
    Kind("judgment", (Field("query", ID), Field("doc", ID), Field("label", GRADE),
                      Field("features", FEATURES))),
    Kind("interaction", (Field("user", ID), Field("item", ID),
                         Field("action", TEXT, required=False))),
    Kind("outcome", (Field("item", ID), Field("label", BINARY), Field("features", FEATURES))),
    Kind("ordinal", (Field("item", ID), Field("label", ORDINAL),
                     Field("features", FEATURES, required=False),
                     Field("text", TEXT, required=False))),
)}
KIND_NAMES: tuple[str, ...] = tuple(sorted(KINDS))


def schema(kind: str) -> pa.Schema:
    """Arrow schema of the stored events of ``kind`` (raises ``KeyError`` for unknown kinds)."""
    return KINDS[kind].schema


def default_topic(kind: str) -> str:
    """Kafka topic that carries ``kind`` unless configured otherwise: ``rankstream.<kind>``.

    >>> default_topic("rating")
    'rankstream.rating'
    """
    if kind not in KINDS:
        raise KeyError(f"unknown kind {kind!r}; expected one of {', '.join(KIND_NAMES)}")
    return f"rankstream.{kind}"
