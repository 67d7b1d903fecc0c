"""The fast paths of ingestion agree with the general ones.

* Compact column batches read by the jitted kernel (:mod:`pipeline.ingest.fast_batch`) give a
  buffer the same stored rows and the same dead letters as ``msgpack.unpackb`` plus the column
  checks; the fast path takes every valid batch of the kinds it knows, and leaves any other
  message alone.
* msgspec's JSON decoder (:func:`pipeline.ingest.codec.decode`) gives the same objects as
  ``json.loads`` whenever it accepts a text.
* The kernels' pieces: integer ids as text like ``str(int)``; UTF-8 checked like Python's strict
  codec.
"""

from __future__ import annotations

import json
import math
import re

import msgpack
import numpy as np
import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pipeline.ingest import _batch_kernels as K
from pipeline.ingest import buffer as buffer_module
from pipeline.ingest import codec
from pipeline.ingest.buffer import PartitionBuffer
from pipeline.ingest.codec import encode_batch
from pipeline.ingest.events import KIND_NAMES, MAX_ABS_NUMBER, MAX_ID_CHARS
from pipeline.ingest.fast_batch import FAST_KINDS, read_batch
from pipeline.ingest.validate import Limits
from tests.ingest.test_validate import events

TS = 1_700_000_000_000    # a valid event time (2023-11-14)

MAX_TS = 2**41          # > every timestamp the strategies draw (up to 2026 or 2^40)


def _buffer(values, fast: bool, monkeypatch, default_kind=None) -> PartitionBuffer:
    assert buffer_module.load_fast_path(timeout=600), "the fast path's kernels did not load"
    buf = PartitionBuffer("t", 0, default_kind=default_kind)
    with monkeypatch.context() as m:
        if not fast:
            m.setattr(buffer_module, "_read_fast", lambda *args: None)
        buf.add_messages(values, list(range(7, 7 + len(values))))
    return buf


def _contents(buf: PartitionBuffer):
    tables = {kind: pa.concat_tables(parts).combine_chunks()
              for kind, parts in sorted(buf.tables.items())}
    dead = list(zip(buf.dead.offsets, buf.dead.indexes, buf.dead.kinds, buf.dead.reasons,
                    buf.dead.raws))
    return tables, dead


def _assert_same_as_general_path(values, monkeypatch, default_kind=None):
    fast_tables, fast_dead = _contents(_buffer(values, True, monkeypatch, default_kind))
    slow_tables, slow_dead = _contents(_buffer(values, False, monkeypatch, default_kind))
    assert fast_dead == slow_dead
    assert fast_tables.keys() == slow_tables.keys()
    for kind in fast_tables:
        assert fast_tables[kind].equals(slow_tables[kind]), (
            kind, fast_tables[kind].to_pylist()[:3], slow_tables[kind].to_pylist()[:3])


# ------------------------------------------------------------------ compact batches

ODD_VALUES = [None, True, False, "", "\x00", "x" * (MAX_ID_CHARS + 1), "é" * MAX_ID_CHARS,
              "é" * (MAX_ID_CHARS + 1), -1, 0, 2**31, 2**63 - 1, -2**63, 2**63, 2**64 - 1,
              math.nan, math.inf, -math.inf, -0.0, 1e308, b"bin", b"", [], {}, [1], {"a": 1},
              "2024-01-01T00:00:00Z", "later", msgpack.ExtType(3, b"x"), 1.5, "\ud7ff"]


@st.composite
def fast_rows(draw):
    """``(kind, valid events)`` of a kind the fast path knows, each id field either all strings
    or all integers (a column mixing the two takes the general path)."""
    kind = draw(st.sampled_from(sorted(FAST_KINDS)))
    text = st.text(st.characters(blacklist_categories=("Cc", "Cs")), min_size=1, max_size=8)
    as_text = {name: draw(st.booleans()) for name in ("user", "item", "winner", "loser")}

    def an_id(name):
        return draw(text) if as_text[name] else draw(st.integers(-2**63, 2**63 - 1))

    rows = []
    for i in range(draw(st.integers(1, 30))):
        row = {"event_id": draw(text), "ts": draw(st.integers(Limits().min_ts, 2**40)),
               "user": an_id("user")}
        if kind == "comparison":
            row["winner"], row["loser"] = an_id("winner"), an_id("loser")
            if str(row["winner"]) == str(row["loser"]):     # another of the same type
                loser = row["loser"]
                row["loser"] = (f"{loser}-other" if type(loser) is str
                                else loser - 1 if loser > 0 else loser + 1)
        else:
            row["item"] = an_id("item")
        if kind == "rating":
            row["rating"] = draw(st.one_of(st.integers(-10**9, 10**9),
                                           st.floats(-MAX_ABS_NUMBER, MAX_ABS_NUMBER)))
        if kind == "interaction" and draw(st.booleans()):
            row["action"] = draw(st.text(max_size=6))
        rows.append(row)
    return kind, rows


@st.composite
def column_batches(draw):
    """A msgpack column batch: usually valid, sometimes with odd values, columns or header."""
    if draw(st.booleans()):
        kind, rows = draw(fast_rows())
    else:
        kind = draw(st.sampled_from(KIND_NAMES))
        rows = draw(st.lists(events(kind, valid_only=draw(st.booleans())), min_size=1,
                             max_size=12))
    try:
        batch = msgpack.unpackb(encode_batch(kind, rows), raw=False, strict_map_key=False)
    except (OverflowError, TypeError, ValueError, UnicodeEncodeError):   # not sendable
        batch = msgpack.unpackb(encode_batch(kind, rows[:0] + [{"event_id": "e", "ts": TS + 1}]))
    columns, n = batch["columns"], batch["n"]
    for _ in range(draw(st.sampled_from([0, 0, 0, 1, 2, 3]))):
        name = draw(st.sampled_from(sorted(columns) + ["extra", "kind"]))
        values = columns.setdefault(name, [None] * n)
        values[draw(st.integers(0, n - 1))] = draw(st.sampled_from(ODD_VALUES))
    case = draw(st.integers(0, 12))
    if case == 0:
        del batch["kind"]                       # the default kind applies
    elif case == 1:
        batch["n"] = draw(st.sampled_from([n + 1, n - 1, 0, -1, "1", None]))
    elif case == 2:
        batch["batch"] = draw(st.sampled_from([2, 0, True, 1.0, "1", None]))
    elif case == 3:
        columns.pop(draw(st.sampled_from(sorted(columns))))
    elif case == 4:
        batch["note"] = draw(st.sampled_from(["x", 5, None, [1], {"a": 1}, b"b"]))
    single = draw(st.booleans())
    try:
        value = msgpack.packb(batch, use_bin_type=True, use_single_float=single)
    except (OverflowError, TypeError, ValueError, UnicodeEncodeError):
        value = msgpack.packb({"batch": 1, "kind": "rating", "n": 0, "columns": {}})
    cut = draw(st.integers(0, 40))
    if cut == 1:
        value = value[:draw(st.integers(1, len(value) - 1))]     # cut short
    elif cut == 2:
        value += b"\x00"                                         # trailing bytes
    return value


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(column_batches(), min_size=1, max_size=3),
       st.sampled_from([None, "rating", "interaction"]))
def test_batches_store_the_same_rows_and_dead_letters_either_way(values, default_kind):
    monkeypatch = pytest.MonkeyPatch()
    try:
        _assert_same_as_general_path(values, monkeypatch, default_kind)
    finally:
        monkeypatch.undo()


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(fast_rows(), st.booleans())
def test_the_fast_path_takes_every_valid_batch_of_its_kinds(kind_and_rows, single_floats):
    kind, rows = kind_and_rows
    try:
        value = encode_batch(kind, rows)
    except UnicodeEncodeError:          # a lone surrogate in an action: not sendable
        return
    if single_floats:
        try:
            value = msgpack.packb(msgpack.unpackb(value, raw=False), use_bin_type=True,
                                  use_single_float=True)
        except OverflowError:           # a double out of single range: keep the doubles
            pass
    assert read_batch(value, 7, None, MAX_TS) is not None
    monkeypatch = pytest.MonkeyPatch()
    try:
        _assert_same_as_general_path([value], monkeypatch)
    finally:
        monkeypatch.undo()


def test_the_fast_path_leaves_other_messages_to_the_general_path(monkeypatch):
    good = {"event_id": "e1", "ts": TS + 5, "user": 7, "item": "a", "rating": 4.5}
    taken = encode_batch("rating", [good])
    assert read_batch(taken, 0, None, MAX_TS) is not None
    declined = [
        encode_batch("rating", [{**good, "rating": "five"}]),          # a bad value
        encode_batch("rating", [good, {**good, "user": "u7"}]),         # an id column mixing
        encode_batch("rating", [{**good, "ts": MAX_TS + 1}]),           # in the future
        encode_batch("comparison", [{"event_id": "e", "ts": TS + 1, "user": 1, "winner": 42,
                                     "loser": "42"}]),                 # winner == loser
        encode_batch("judgment", [{"event_id": "e", "ts": TS + 1, "query": 1, "doc": 2,
                                   "label": 1, "features": [1.0]}]),   # features: not here
        encode_batch("click", [good]),                                  # unknown kind
        taken[:-1], taken + b"\xc0",                                    # cut short, trailing
        # a column named twice: msgpack keeps the last, so must we
        taken.replace(b"\xa4item", b"\xa4user"),
        codec.encode_msgpack(good),                                     # a single event
    ]
    for value in declined:
        assert read_batch(value, 0, None, MAX_TS) is None, value
    assert read_batch(b"\x80", 0, None, MAX_TS) is None                 # an empty map
    _assert_same_as_general_path([taken, *declined], monkeypatch)


def test_nulls_in_an_optional_text_column(monkeypatch):
    rows = [{"event_id": f"e{i}", "ts": TS + i, "user": i, "item": "i",
             **({"action": "view"} if i % 3 else {})} for i in range(10)]
    kind, batch = read_batch(encode_batch("interaction", rows), 3, None, MAX_TS)
    assert batch.column("action").to_pylist() == [None if i % 3 == 0 else "view"
                                                  for i in range(10)]
    _assert_same_as_general_path([encode_batch("interaction", rows)], monkeypatch)


@pytest.mark.parametrize("broken", ["add", "take"])
def test_a_failing_fast_path_costs_speed_not_events(monkeypatch, broken):
    """Should the fast path raise (a bug), the general path takes the messages: the same rows
    and dead letters, no message lost or turned into a dead letter."""
    rows = [{"event_id": f"e{i}", "ts": TS + i, "user": i, "item": "i", "rating": 1.5}
            for i in range(20)]
    values = [encode_batch("rating", rows[:10]), encode_batch("rating", rows[10:]),
              encode_batch("rating", [{**rows[0], "event_id": "bad", "rating": "x"}])]
    expected = _contents(_buffer(values, False, monkeypatch))

    def fail(*args, **kwargs):
        raise RuntimeError("a bug in the fast path")

    assert buffer_module.load_fast_path(timeout=600)
    monkeypatch.setattr(buffer_module._FAST_PATH.module.BatchReader, broken, fail)
    tables, dead = _contents(_buffer(values, True, monkeypatch))
    assert dead == expected[1] and len(dead) == 1
    assert tables.keys() == expected[0].keys()
    assert tables["rating"].equals(expected[0]["rating"])


# ------------------------------------------------------------------ kernel pieces

def test_int_text_is_str_of_int():
    rng = np.random.default_rng(5)
    values = np.concatenate([
        np.array([0, 1, -1, 9, 10, -10, 2**63 - 1, -2**63, 10**18, 10**18 - 1, -10**18],
                 np.int64),
        rng.integers(-2**63, 2**63 - 1, 5000, dtype=np.int64, endpoint=True),
        rng.integers(-2000, 2000, 5000).astype(np.int64)])
    offsets, chars = K.int_text(values)
    text = bytes(chars).decode()
    assert [text[offsets[i]:offsets[i + 1]] for i in range(values.size)] == [
        str(int(v)) for v in values]


_CONTROL = re.compile("[\x00-\x1f\x7f]")


@settings(max_examples=500, deadline=None)
@given(st.one_of(st.binary(max_size=12),
                 st.text(max_size=8).map(lambda s: s.encode("utf-8", "surrogatepass")),
                 st.lists(st.sampled_from([b"\xed\xa0\x80", b"\xc0\x80", b"\xf4\x90\x80\x80",
                                           b"\xe0\x80\x80", b"\xf0\x80\x80\x80", b"\xc3\xa9",
                                           b"\xf4\x8f\xbf\xbf", b"a", b"\x7f", b"\x80"]),
                          max_size=4).map(b"".join)))
def test_utf8_scan_agrees_with_the_strict_codec(data):
    valid, chars, control = K.utf8_scan(np.frombuffer(data, np.uint8), 0, len(data))
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        assert not valid
        return
    assert valid and chars == len(text) and control == bool(_CONTROL.search(text))


# ------------------------------------------------------------------ JSON

def _same(a, b) -> bool:
    """Equal and of the same types all the way down (1 vs 1.0 vs True, -0.0, key order)."""
    if type(a) is not type(b):
        return False
    if type(a) is float:
        return repr(a) == repr(b)
    if type(a) is list:
        return len(a) == len(b) and all(map(_same, a, b))
    if type(a) is dict:
        return list(a) == list(b) and all(_same(a[k], b[k]) for k in a)
    return a == b


json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-2**80, 2**80) | st.floats()
    | st.text(st.characters(codec=None), max_size=6),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=3), inner,
                                                                max_size=4),
    max_leaves=12)
json_texts = st.one_of(
    st.tuples(json_values, st.booleans()).map(
        lambda v: json.dumps(v[0], ensure_ascii=v[1]).encode("utf-8", "surrogatepass")),
    st.text('{}[]":,.-+eE0123456789 \\untrfalsNIy\t\n', max_size=30).map(str.encode),
    st.binary(max_size=20))


@settings(max_examples=1000, deadline=None)
@given(json_texts)
def test_msgspec_json_agrees_with_json_loads(value):
    try:
        fast, accepted = codec._fast_loads(value), True
    except Exception:
        fast, accepted = None, False
    as_json = not (value[:1] and value[0] in codec._MSGPACK_FIRST_BYTES)
    try:
        reference = json.loads(value.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError):
        assert not accepted, value
        if as_json:
            with pytest.raises(codec.DecodeError):
                codec.decode(value)
        return
    if accepted:
        assert _same(fast, reference), (value, fast, reference)
    if as_json:
        assert _same(codec.decode(value)[0], reference)
