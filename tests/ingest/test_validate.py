"""Validation: precise reasons, and the vectorized column checks against the per-event
reference (hypothesis)."""

from __future__ import annotations

import math
import random
from datetime import datetime

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pipeline.ingest.buffer import PartitionBuffer
from pipeline.ingest.codec import batch_row, decode, encode_batch, encode_json, encode_msgpack
from pipeline.ingest.events import KIND_NAMES, KINDS, parse_iso_ts
from pipeline.ingest.validate import check_event, normalize_event, validate_columns, validate_rows
from tests.ingest.factory import make_event

BASE = {"event_id": "e1", "ts": 1_700_000_000_000}


def reason(event, default_kind=None):
    return check_event(event, default_kind)


@pytest.mark.parametrize("event, expected", [
    ({"kind": "rating", **BASE, "user": 1, "item": 2, "rating": "five"},
     "rating: field 'rating' is 'five', expected a number"),
    ({"kind": "comparison", **BASE, "user": 1, "winner": "i42", "loser": "i42"},
     "comparison: winner == loser == 'i42'"),
    ({"kind": "comparison", **BASE, "user": 1, "winner": 42, "loser": "42"},
     "comparison: winner == loser == '42'"),
    ({"kind": "judgment", **BASE, "query": 1, "doc": 2, "label": 1, "features": {"-3": 1}},
     "judgment: features: index -3 < 0"),
    ({"kind": "judgment", **BASE, "query": 1, "doc": 2, "label": 1, "features": {"3": 1,
                                                                                  "03": 2}},
     "judgment: features: index 3 appears twice"),
    ({"kind": "judgment", **BASE, "query": 1, "doc": 2, "label": 1, "features": {"x": 1}},
     "judgment: features: index 'x' is not an integer"),
    ({"kind": "outcome", **BASE, "item": 1, "label": 1, "features": [1, float("nan")]},
     "outcome: features: value at position 1 is nan, expected a finite number"),
    ({"kind": "outcome", **BASE, "item": 1, "label": True, "features": [1]},
     "outcome: field 'label' is true, expected 0 or 1"),
    ({"kind": "ordinal", **BASE, "item": 1, "label": 1},
     "ordinal: needs 'features' or 'text'"),
    ({"kind": "ordinal", **BASE, "item": 1, "label": 1.0, "text": "x"},
     "ordinal: field 'label' is 1.0, expected an integer"),
    ({"kind": "click", **BASE},
     "unknown kind 'click' (expected comparison, interaction, judgment, ordinal, outcome or "
     "rating)"),
    ({**BASE, "user": 1}, "missing field 'kind' and no default kind for this source (give --kind)"),
    ({"kind": "rating", "event_id": 7, "ts": 1_700_000_000_001, "user": 1, "item": 2, "rating": 1},
     "rating: field 'event_id' is 7, expected a string"),
    ({"kind": "rating", "event_id": "e", "ts": -1, "user": 1, "item": 2, "rating": 1},
     "rating: field 'ts' is -1, before 1970-01-01 (epoch ms)"),
    ({"kind": "rating", "event_id": "e", "ts": 1.5e12, "user": 1, "item": 2, "rating": 1},
     "rating: field 'ts' is 1500000000000.0, expected epoch milliseconds or an ISO-8601 "
     "string"),
    ({"kind": "rating", **BASE, "user": "", "item": 2, "rating": 1},
     "rating: field 'user' is empty"),
    ({"kind": "rating", **BASE, "user": "a\ud800", "item": 2, "rating": 1},
     "rating: field 'user' is not valid Unicode (a lone surrogate at position 1)"),
    ({"kind": "rating", **BASE, "item": 2, "rating": None},
     "rating: missing field 'user'"),
    ({"kind": "rating", **BASE, "user": 4.5, "item": 2, "rating": 1},
     "rating: field 'user' is 4.5, expected a string or an integer"),
    ("just text", "event is 'just text', expected an object"),
    # declared ranges: a "no time" 0, epoch seconds, ratings and features no scale has
    ({"kind": "rating", "event_id": "e", "ts": 0, "user": 1, "item": 2, "rating": 1},
     "rating: field 'ts' is 0, before 1990-01-01, the earliest time accepted "
     "(RANKSTREAM_MIN_EVENT_TIME); ts is epoch milliseconds, not seconds"),
    ({"kind": "rating", "event_id": "e", "ts": 1_700_000_000, "user": 1, "item": 2,
      "rating": 1}, "rating: field 'ts' is 1700000000, before 1990-01-01, the earliest time "
     "accepted (RANKSTREAM_MIN_EVENT_TIME); ts is epoch milliseconds, not seconds"),
    ({"kind": "rating", **BASE, "user": 1, "item": 2, "rating": 1e308},
     "rating: field 'rating' is 1e+308, beyond ±1e+15, the largest magnitude accepted"),
    ({"kind": "rating", **BASE, "user": 1, "item": 2, "rating": 10**24},
     "rating: field 'rating' is 1000000000000000000000000, beyond ±1e+15, the largest "
     "magnitude accepted"),
    ({"kind": "outcome", **BASE, "item": 1, "label": 1, "features": [1, -1e24]},
     "outcome: features: value at position 1 is -1e+24, beyond ±1e+15, the largest "
     "magnitude accepted"),
    ({"kind": "judgment", **BASE, "query": 1, "doc": 2, "label": 101, "features": [1]},
     "judgment: field 'label' is 101, expected an integer <= 100"),
    ({"kind": "ordinal", **BASE, "item": 1, "label": 1_000_000_000, "text": "x"},
     "ordinal: field 'label' is 1000000000, expected an integer <= 1000"),
])
def test_reasons_name_kind_field_and_value(event, expected):
    assert reason(event) == expected
    tables, bad = validate_rows([event], np.array([0]))
    assert bad == {0: expected}
    assert sum(t.num_rows for t in tables.values()) == 0


def test_normalization_ids_ts_and_features():
    event = {"kind": "judgment", "event_id": "é1", "ts": "2024-01-01T00:00:00.250Z",
             "query": 17, "doc": "文档", "label": 2, "features": {"10": 1.5, "2": -1}}
    out = normalize_event(event)
    assert out["query"] == "17" and out["doc"] == "文档"
    assert out["ts"] == parse_iso_ts("2024-01-01T00:00:00.250+00:00") == 1_704_067_200_250
    assert out["feature_index"] == [2, 10] and out["feature_value"] == [-1.0, 1.5]
    assert normalize_event({**event, "features": [0.5, 0, 2]})["feature_index"] == [0, 1, 2]
    naive = normalize_event({**event, "ts": "2024-01-01T00:00:00"})["ts"]
    assert naive == 1_704_067_200_000                      # a naive time is UTC


def test_default_kind_and_extra_fields():
    event = {**BASE, "user": 1, "item": 2, "rating": 3, "comment": "ignored"}
    assert reason(event, "rating") is None
    tables, bad = validate_rows([event], np.array([5]), default_kind="rating")
    assert not bad and tables["rating"].column("offset").to_pylist() == [5]


def _buffer_reasons(values):
    buf = PartitionBuffer("t", 0, max_message_bytes=200)
    buf.add_messages(values, list(range(len(values))))
    return buf.dead.reasons


def test_message_level_reasons():
    assert _buffer_reasons([b'{"kind": "rating", "event_id": "\xff"}']) == [
        "bad UTF-8 at byte 32: invalid start byte"]
    assert _buffer_reasons([b'{"kind": "rating",']) == [
        "bad JSON: Expecting property name enclosed in double quotes at line 1 column 19"]
    assert _buffer_reasons([b"x" * 201]) == ["message is 201 bytes, over the limit of 200"]
    assert _buffer_reasons([b""]) == ["empty message"]
    assert _buffer_reasons([b"[]"]) == [
        "message is an empty array, expected an event object or an array of events"]
    assert _buffer_reasons([b"\x82\xa1a"])[0].startswith("bad msgpack: ")
    assert _buffer_reasons([encode_msgpack({"batch": 1, "kind": "rating", "n": 2,
                                            "columns": {"user": [1]}})]) == [
        "batch: column 'user' has 1 values, expected 2"]
    assert _buffer_reasons([encode_msgpack({"batch": 1, "kind": "clicks", "n": 1,
                                            "columns": {"user": [1]}})]) == [
        "unknown kind 'clicks' (expected comparison, interaction, judgment, ordinal, outcome or "
        "rating)"]


def test_bad_event_inside_a_batch_keeps_its_position_and_bytes():
    rng = random.Random(0)
    events = [make_event("rating", i, rng) for i in range(5)]
    events[3]["rating"] = "five"
    buf = PartitionBuffer("t", 0)
    buf.add_messages([encode_batch("rating", events), encode_json(events)], [7, 8])
    assert buf.events == 8
    assert buf.dead.offsets == [7, 8] and buf.dead.indexes == [3, 3]
    assert set(buf.dead.reasons) == {"rating: field 'rating' is 'five', expected a number"}
    assert decode(buf.dead.raws[0])[0]["event_id"] == "ev-3"
    assert decode(buf.dead.raws[1])[0]["event_id"] == "ev-3"


# ------------------------------------------------------------------ hypothesis properties

anything = st.one_of(
    st.none(), st.booleans(), st.integers(-2**70, 2**70),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(st.characters(codec=None), max_size=6),
    st.lists(st.integers(-3, 3), max_size=3), st.dictionaries(st.text(max_size=2),
                                                              st.integers(), max_size=2))
ids = st.one_of(st.integers(-10, 2**63), st.text(min_size=1, max_size=8))
valid_ids = st.one_of(st.integers(-10, 2**63), st.text(
    st.characters(blacklist_categories=("Cc", "Cs")), min_size=1, max_size=8))
numbers = st.one_of(st.integers(-10**6, 10**6), st.floats(-1e6, 1e6))
feature_keys = st.one_of(st.integers(-2, 40).map(str), st.integers(-2, 40),
                         st.sampled_from(["007", "7", "x", "", "+3", " 4", "1e2"]))
dense = st.lists(st.one_of(numbers, st.just(float("inf")), st.booleans()), max_size=6)
sparse = st.dictionaries(feature_keys, st.one_of(numbers, st.just(math.nan), st.text(max_size=1)),
                         max_size=5)
VALID = {"id": valid_ids, "number": numbers, "grade": st.integers(0, 4),
         "binary": st.integers(0, 1),
         "ordinal": st.integers(1, 5), "text": st.text(max_size=5),
         "features": st.one_of(st.lists(numbers, max_size=6),
                               st.dictionaries(st.integers(0, 40).map(str), numbers,
                                               max_size=5))}
timestamps = st.one_of(st.integers(631_152_000_000, 2**40),   # 1990 to 2004: valid
                       st.datetimes(min_value=datetime(1990, 1, 2),
                                    max_value=datetime(2026, 1, 1)).map(datetime.isoformat))


@st.composite
def events(draw, kind=None, valid_only=False):
    """An event whose every field is usually right, sometimes wrong, sometimes absent."""
    kind = kind or draw(st.sampled_from(KIND_NAMES))

    def pick(good):
        if valid_only:
            return draw(good)
        return draw(st.one_of(good, good, good, anything, dense, sparse))

    event = {"kind": kind, "event_id": pick(st.text(
                 st.characters(blacklist_categories=("Cc", "Cs")), min_size=1, max_size=6)),
             "ts": pick(st.one_of(timestamps, st.datetimes().map(datetime.isoformat)))
             if not valid_only else draw(timestamps)}
    for f in KINDS[kind].fields:
        if valid_only or draw(st.integers(0, 9)):
            event[f.name] = pick(VALID[f.check])
    if not valid_only and draw(st.integers(0, 20)) == 0:
        del event[draw(st.sampled_from(sorted(event)))]
    if valid_only and kind == "comparison" and str(event["winner"]) == str(event["loser"]):
        event["loser"] = f"{event['winner']}-other"
    return event


def _assert_matches_reference(table, bad, rows, default_kind=None):
    expected_rows = []
    for i, row in enumerate(rows):
        expected = reason(row, default_kind)
        assert bad.get(i) == expected, (i, row)
        if expected is None:
            normalized = normalize_event(row, default_kind)
            normalized.pop("kind")
            expected_rows.append(normalized)
    stored = [{k: v for k, v in r.items() if k != "offset"} for r in table.to_pylist()]
    assert stored == expected_rows


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(events(), max_size=25), st.sampled_from([None, "rating", "ordinal"]))
def test_row_validation_matches_the_reference(rows, default_kind):
    tables, bad = validate_rows(rows, np.arange(len(rows)), default_kind)
    for kind, table in tables.items():
        index = [i for i, r in enumerate(rows) if (r.get("kind", default_kind)) == kind]
        sub = {j: bad[i] for j, i in enumerate(index) if i in bad}
        _assert_matches_reference(table, sub, [rows[i] for i in index], default_kind)
    assert set(bad) == {i for i, r in enumerate(rows) if reason(r, default_kind)}


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.sampled_from(KIND_NAMES).flatmap(
    lambda kind: st.tuples(st.just(kind), st.lists(events(kind), min_size=1, max_size=25))))
def test_column_batches_match_the_reference(kind_and_rows):
    kind, rows = kind_and_rows
    batch, _ = decode(encode_batch(kind, rows)) if _packable(rows) else (None, None)
    if batch is None:
        return
    columns, n = batch["columns"], batch["n"]
    table, bad = validate_columns(kind, columns, n, np.zeros(n, dtype=np.int64))
    _assert_matches_reference(table, bad, [batch_row(columns, i) for i in range(n)], kind)


def _packable(rows) -> bool:
    try:
        encode_batch("rating", rows)
        return True
    except (OverflowError, UnicodeEncodeError, TypeError, ValueError):
        return False


@settings(max_examples=100, deadline=None)
@given(st.lists(events(valid_only=True), min_size=1, max_size=20))
def test_valid_events_always_pass(rows):
    tables, bad = validate_rows(rows, np.arange(len(rows)))
    assert bad == {}
    assert sum(t.num_rows for t in tables.values()) == len(rows)
