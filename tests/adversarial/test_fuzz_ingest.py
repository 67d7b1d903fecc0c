"""Fuzzing Kafka ingestion through the real broker.

At least 10,000 hostile messages (random bytes from empty to over the size limit, tombstones,
integers of more than 4,300 digits, nesting thousands deep, ``kind`` and ids of every wrong
type, odd feature maps and times, msgpack bin/ext/non-string keys/huge arrays, malformed column
batches, arrays mixing good and bad events, invalid UTF-8, lone surrogates) are produced into
two real topics between good events, then drained by :func:`ingest_kafka` with
``until_end=True`` and small flush sizes. Ingestion must finish, every valid event must be in
the store exactly once (multiset of event ids), and every bad message or bad event inside a
message must be a dead letter, in the local dead-letter files and on the dead-letter topic,
matched by topic, partition, offset and index, with a non-empty reason.

What is valid is decided per message by the plain reference checks
(:func:`pipeline.ingest.validate.check_event`, :func:`pipeline.ingest.codec.batch_columns`),
never by the fast path under test; an input on which the reference itself raises counts as bad.

It takes 25-40 s on two shared cores (marked ``slow``; most of it is kafka-python's
per-message cost: ~13,500 messages in, ~13,000 dead letters out). Repeat a run with the seed it
prints::

    RANKSTREAM_FUZZ_SEED=123 .venv/bin/pytest tests/adversarial/test_fuzz_ingest.py -s

``RANKSTREAM_FUZZ_FAMILIES=tombstone,deep_nesting`` limits the inputs to some families (the
names are the keys of :data:`FAMILIES`), ``RANKSTREAM_FUZZ_N`` sets how many hostile inputs
(default 10,000). When ingestion raises, the failure message carries a census: every input fed
alone to a :class:`~pipeline.ingest.buffer.PartitionBuffer` (then one flush per family into a
scratch store, without the dead-letter topic), with the exceptions per family, so one run
names every family that still breaks ingestion.
"""

from __future__ import annotations

import json
import os
import random
import re
import time
import traceback
from collections import Counter, defaultdict
from dataclasses import dataclass, field

import msgpack
import pytest

from pipeline.ingest.buffer import DEFAULT_MAX_MESSAGE_BYTES, PartitionBuffer
from pipeline.ingest.codec import batch_columns, batch_row, decode, encode_batch, is_batch
from pipeline.ingest.events import KIND_NAMES, MAX_TS_MS
from pipeline.ingest.kafka import ingest_kafka, new_group_id
from pipeline.ingest.local_store import LocalEventStore
from pipeline.ingest.open_store import open_store
from pipeline.ingest.producer import PRODUCER_CONFIG
from pipeline.ingest.store import EventStore
from pipeline.ingest.validate import check_event, normalize_event, resolve_kind
from tests.ingest.factory import make_event, new_topic, settings_for

MAX_BYTES = DEFAULT_MAX_MESSAGE_BYTES
N_FUZZ = int(os.environ.get("RANKSTREAM_FUZZ_N", 10_000))
DEFAULT_KINDS = {"A": "rating", "B": None}    # topic A has a default kind, topic B none


# ---------------------------------------------------------------- encoding helpers

def _json(obj, ascii_only: bool = True) -> bytes:
    """JSON text; with ``ascii_only`` lone surrogates come out as ``\\udXXX`` escapes."""
    return json.dumps(obj, separators=(",", ":"), ensure_ascii=ascii_only).encode()


def _pack(obj) -> bytes:
    return msgpack.packb(obj, use_bin_type=True)


def _mp_map(items: list[tuple[object, bytes]]) -> bytes:
    """A msgpack map from (key, already packed value) pairs (for values packb refuses)."""
    head = (bytes([0x80 | len(items)]) if len(items) < 16
            else b"\xde" + len(items).to_bytes(2, "big"))
    return head + b"".join(_pack(k) + v for k, v in items)


def _mp_array(packed: list[bytes]) -> bytes:
    head = (bytes([0x90 | len(packed)]) if len(packed) < 16
            else b"\xdc" + len(packed).to_bytes(2, "big"))
    return head + b"".join(packed)


def _deep_json(depth: int, rng: random.Random) -> str:
    shape = rng.choice(["array", "object", "mixed"])
    if shape == "array":
        return "[" * depth + "]" * depth
    if shape == "object":
        return '{"a":' * depth + "1" + "}" * depth
    opens = "".join("[" if i % 2 else '{"k":' for i in range(depth))
    closes = "".join("]" if i % 2 else "}" for i in reversed(range(depth)))
    return opens + "0" + closes


def _deep_msgpack(depth: int, rng: random.Random) -> bytes:
    if rng.random() < 0.5:
        return b"\x91" * depth + b"\xc0"
    return b"\x81\xa1k" * depth + b"\x01"


def _event(rng: random.Random, j: int, kind: str | None = None, tag: str = "fz") -> dict:
    """A valid event with event id ``{tag}-{j}`` (a fuzz input breaks one thing in it)."""
    return make_event(kind or rng.choice(KIND_NAMES), j, rng, tag=tag)


def _spliced(event: dict, name: str, raw: bytes, fmt: str) -> bytes:
    """``event`` encoded with field ``name`` set to the already encoded ``raw``."""
    if fmt == "json":
        text = _json({**event, name: "\x01SPLICE\x01"})
        return text.replace(b'"\\u0001SPLICE\\u0001"', raw)
    return _mp_map([(k, _pack(v)) for k, v in event.items() if k != name] + [(name, raw)])


# ---------------------------------------------------------------- the families of inputs

def fam_random_bytes(rng, j):
    n = rng.choice([0, 1, 2, 3, rng.randrange(2049), rng.randrange(2049)])
    if rng.random() < 0.4:     # text in the JSON alphabet reaches deeper into the parser
        return "".join(rng.choices('{}[]":,.-+eE0123456789 \\untrfalsNI\t\n', k=n)).encode()
    data = bytearray(rng.randbytes(n))
    if data and rng.random() < 0.5:   # steer the first byte to JSON or to msgpack
        data[0] = rng.choice(b'{["-0123456789tfn \x80\x8f\x90\x9f\xdc\xdd\xde\xdf')
    return bytes(data)


def fam_oversize(rng, j):
    size = MAX_BYTES + rng.randrange(1, 64 << 10)
    if rng.random() < 0.5:
        return rng.randbytes(size)
    event = _event(rng, j, "ordinal")
    event["text"] = "x" * size
    return _json(event)


def fam_tombstone(rng, j):
    return None


_DIGITS = bytes(b"0123456789"[i % 10] for i in range(256))


def fam_huge_int(rng, j):
    digits = str(rng.randrange(1, 10)) + rng.randbytes(rng.randrange(4300, 9000)).translate(
        _DIGITS).decode()
    number = rng.choice(["", "-"]) + digits + rng.choice(["", "", "", ".5", "e3"])
    event = _event(rng, j)
    where = rng.choice(["ts", "rating", "user", "item", "event_id", "label", "value", "key",
                        "message", "array"])
    if where == "key":         # a feature index of thousands of digits (a JSON string key)
        return _json({**_event(rng, j, "outcome"), "features": {digits: 1.0}})
    if where == "value":
        return _spliced(_event(rng, j, "judgment"), "features",
                        b'{"3":' + number.encode() + b"}", "json")
    if where == "message":
        return number.encode()
    if where == "array":
        return (b"[" + _json(_event(rng, 0, tag=f"fz{j}a")) + b"," + number.encode() + b","
                + _json(_event(rng, 1, tag=f"fz{j}a")) + b"]")
    return _spliced(event, where, number.encode(), "json")


def fam_deep_nesting(rng, j):
    """Nesting of 1,000-5,000 levels: more than any decoder here accepts."""
    depth = rng.randrange(1000, 5001)
    fmt = rng.choice(["json", "json", "msgpack"])
    if fmt == "msgpack":
        depth = max(depth, 1100)
    deep = (_deep_json(depth, rng).encode() if fmt == "json" else _deep_msgpack(depth, rng))
    where = rng.choice(["message", "field", "array"])
    if where == "message":
        return deep
    if where == "field":
        return _spliced(_event(rng, j), rng.choice(["user", "event_id", "kind", "features"]),
                        deep, fmt)
    good = [_event(rng, i, tag=f"fz{j}a") for i in range(rng.randrange(1, 4))]
    if fmt == "json":
        return b"[" + b",".join([_json(g) for g in good] + [deep]) + b"]"
    return _mp_array([_pack(g) for g in good] + [deep])


def fam_medium_nesting(rng, j):
    """Nesting every decoder accepts (msgpack: deeper than its packer accepts), where the
    event is bad and must be re-encoded alone for its dead letter."""
    fmt = rng.choice(["json", "msgpack"])
    depth = rng.randrange(20, 600) if fmt == "json" else rng.randrange(520, 900)
    deep = (_deep_json(depth, rng).encode() if fmt == "json" else _deep_msgpack(depth, rng))
    where = rng.choice(["message", "field", "array", "array", "batch"])
    if where == "message":
        return deep
    if where == "field":
        return _spliced(_event(rng, j), rng.choice(["user", "item", "ts", "rating"]), deep, fmt)
    if where == "batch":       # a column value of a compact batch
        events = [_event(rng, i, "rating", tag=f"fz{j}b") for i in range(rng.randrange(1, 6))]
        batch = msgpack.unpackb(encode_batch("rating", events))
        user = [_pack(u) for u in batch["columns"]["user"]]
        user[rng.randrange(len(user))] = deep
        columns = [(k, _pack(v)) for k, v in batch["columns"].items() if k != "user"]
        return _mp_map([("batch", _pack(1)), ("kind", _pack("rating")), ("n", _pack(len(user))),
                        ("columns", _mp_map(columns + [("user", _mp_array(user))]))])
    good = [_event(rng, i, tag=f"fz{j}a") for i in range(rng.randrange(0, 4))]
    if fmt == "json":
        parts = [_json(g) for g in good] + [deep]
        rng.shuffle(parts)
        return b"[" + b",".join(parts) + b"]"
    parts = [_pack(g) for g in good] + [deep]
    rng.shuffle(parts)
    return _mp_array(parts)


ODD_KINDS = [[], ["rating"], {}, {"rating": 1}, 1, 0, -1, 2.5, None, True, False, "", "RATING",
             "rating ", " rating", "click", "rating\x00", "\u0000", 2**64 - 1, float("nan")]


def fam_kind_odd(rng, j):
    kind = rng.choice(ODD_KINDS + [10**30, "\ud800", b"rating", msgpack.ExtType(1, b"r")])
    if isinstance(kind, (bytes, msgpack.ExtType)):
        fmt = "msgpack"
    elif isinstance(kind, (int, str)) and kind in (10**30, "\ud800"):
        fmt = "json"
    else:
        fmt = rng.choice(["json", "msgpack"])
    encode = _json if fmt == "json" else _pack
    event = {**_event(rng, j), "kind": kind}
    where = rng.choice(["message", "array", "batch"])
    if where == "message":
        return encode(event)
    if where == "batch":
        good = [_event(rng, i, "rating", tag=f"fz{j}b") for i in range(rng.randrange(1, 4))]
        batch = msgpack.unpackb(encode_batch("rating", good))
        batch["kind"] = kind
        return encode(batch)
    good = [_event(rng, i, tag=f"fz{j}a") for i in range(rng.randrange(0, 4))]
    items = good + [event]
    rng.shuffle(items)
    return encode(items)


def _odd_ids(j: int, fmt: str) -> list:
    odd = [[], [1], ["a"], {}, {"a": 1}, 1.5, -0.0, float("nan"), float("inf"), True, False,
           None, "", "\x00", f"a\x00b{j}", "\x00" * 3, f"{j}".rjust(512, "x"),
           f"{j}".rjust(513, "x"), 2**63 - 1, 2**63, 2**64 - 1, -2**63, -1, 0, f"tab\t{j}",
           f"nl\n{j}", f"del\x7f{j}", f"emoji\U0001f642{j}", " ", f"\u200b{j}", f"{j}\u0085"]
    if fmt == "json":
        return odd + [-2**63 - 1, 2**64, 10**30, 10**100, -10**40]
    return odd + [b"bin", b"", msgpack.ExtType(1, b"x"), msgpack.Timestamp(5, 0)]


def fam_ids_odd(rng, j):
    fmt = rng.choice(["json", "msgpack"])
    event = _event(rng, j)
    kind = event["kind"]
    names = ["event_id"] + [n for n in ("user", "item", "winner", "loser", "query", "doc")
                            if n in event]
    name = rng.choice(names)
    value = rng.choice(_odd_ids(j, fmt))
    if name == "event_id" and isinstance(value, str) and value and len(value) < 500:
        value = f"{value}#{j}"          # a valid odd event id stays unique
    event[name] = value
    if kind == "comparison" and name in ("winner", "loser") and rng.random() < 0.2:
        event["winner"] = event["loser"] = value      # winner == loser, odd types
    encode = _json if fmt == "json" else _pack
    if rng.random() < 0.25:
        good = [_event(rng, i, tag=f"fz{j}a") for i in range(rng.randrange(1, 4))]
        return encode(good + [event])
    return encode(event)


def _odd_feature_keys(fmt: str) -> list:
    keys = ["-1", "-0", "0", "00", "03", str(2**24 - 1), str(2**24), str(2**31 - 1),
            str(2**31), "99999999999", "1" * 30, "abc", "1.5", "", " 1", "1 ", "+1", "0x1",
            "\u0661", "\u00b2", "1e3", "NaN"]
    if fmt == "msgpack":
        keys += [-1, 0, 5, 2**31, 2**63, 2**64 - 1, -2**63, 1.0, float("nan"), b"1", None,
                 True]
    return keys


def _odd_feature_values(fmt: str) -> list:
    values = [0.5, -1, 0, 1e308, -1e308, float("nan"), float("inf"), float("-inf"), "NaN",
              "nan", "1.0", "", None, True, False, [], {}, [1.0], 2**63 - 1, -2**63]
    if fmt == "json":
        values += [10**30, 10**400, -10**400]
    else:
        values += [b"\x00", msgpack.ExtType(2, b"")]
    return values


def fam_features_odd(rng, j):
    fmt = rng.choice(["json", "msgpack"])
    event = _event(rng, j, rng.choice(["outcome", "judgment", "ordinal"]))
    keys, values = _odd_feature_keys(fmt), _odd_feature_values(fmt)
    shape = rng.choice(["sparse", "sparse", "dense", "dense", "container", "duplicate"])
    if shape == "sparse":
        features = {rng.choice(keys): rng.choice([0.5, 1.0, rng.choice(values)])
                    for _ in range(rng.randrange(1, 5))}
    elif shape == "dense":
        features = [rng.choice([0.25, 1.0, -3, rng.choice(values)])
                    for _ in range(rng.randrange(1, 9))]
    elif shape == "duplicate":
        features = {"3": 1.0, "03": 2.0} if fmt == "json" or rng.random() < .5 else {3: 1.0,
                                                                                       "3": 2.0}
    else:
        features = rng.choice(["1,2,3", 5, None, True, [], {}, [[1.0]], [{"0": 1}], "",
                               [None], {"0": [1.0]}])
    if fmt == "json" and isinstance(features, dict):
        features = {str(k): v for k, v in features.items()}
    event["features"] = features
    if rng.random() < 0.1:     # NaN-ish spelled as JSON number literals the parser turns to inf
        return _spliced(event, "features", b'{"1":1e400,"2":-1e999}', "json")
    return _json(event) if fmt == "json" else _pack(event)


ODD_TS = [MAX_TS_MS, MAX_TS_MS + 1, 10**19, 2**63 - 1, 2**64 - 1, -1, -10**15, -2**63, 0, 1,
          "9999-12-31T23:59:59.999Z", "9999-12-31T23:59:59.999999+00:00",
          "9999-12-31T23:59:59-01:00", "9999-12-31T23:59:59+14:00", "10000-01-01T00:00:00Z",
          "0001-01-01T00:00:00Z", "0000-01-01T00:00:00Z", "1969-12-31T23:59:59.999Z",
          "1970-01-01T00:00:00Z", "-0001-01-01T00:00:00Z", "", "now", "2024-02-30T00:00:00Z",
          "2024-13-01", "9999-12-31", "2024-01-01T25:00:00", "2024-01-01T00:00:00+24:00",
          1.7e12, float("nan"), float("inf"), True, None, [], {}, "\x00", "1700000000000",
          "\uff12\uff10\uff12\uff14-01-01", "2100-01-01T00:00:00Z", "2262-04-12T00:00:00Z"]


def fam_ts_odd(rng, j):
    fmt = rng.choice(["json", "msgpack"])
    ts = rng.choice(ODD_TS + ([10**30, -10**30] if fmt == "json" else [b"1", msgpack.Timestamp(
        1_700_000_000, 0)]))
    event = {**_event(rng, j), "ts": ts}
    return _json(event) if fmt == "json" else _pack(event)


_BUDGET = Counter()     # caps on the expensive sub-cases, per run (reset by generate())


def fam_msgpack_odd(rng, j):
    event = _event(rng, j)
    case = rng.randrange(12)
    if case == 0:              # a field as bin, ext or timestamp
        name = rng.choice(["event_id", "kind", "ts", "user", "item", "rating", "label"])
        event[name] = rng.choice([b"x", b"", b"\xff" * 3, msgpack.ExtType(7, b"abc"),
                                  msgpack.ExtType(127, b"\x00" * 4), msgpack.Timestamp(1, 2)])
        return _pack(event)
    if case == 1:              # extra fields with non-string keys: the event stays valid
        extra = {1: "x", None: 2, 1.5: 3, b"k": 4, False: 5, -7: {2: {None: b"z"}}}
        return _pack({**event, **dict(rng.sample(list(extra.items()), 3))})
    if case == 2:              # a field holding a map with non-string keys
        event[rng.choice(["user", "event_id", "ts", "features"])] = {1: {2: {None: b"x"}},
                                                                     b"k": [1]}
        return _pack(event)
    if case == 3:              # "kind" under a bin key: the event has no (string) kind
        return _mp_map([(b"kind", _pack(event.pop("kind")))]
                       + [(k, _pack(v)) for k, v in event.items()])
    if case == 4:              # headers claiming huge counts, truncated data
        return rng.choice([b"\xdd\xff\xff\xff\xff\x01", b"\xdf\xff\xff\xff\xff\xa1a",
                           b"\xdb\xff\xff\xff\xffabc", b"\xc6\xff\xff\xff\xff\x00",
                           b"\xdc\xff\xff", b"\x81\xa5event"])
    if case == 5:              # trailing bytes, truncation
        data = _pack(event)
        return data + b"\x00" if rng.random() < 0.5 else data[:rng.randrange(1, len(data))]
    if case == 6:              # top-level scalars of every msgpack type
        return rng.choice([b"\xc0", b"\xc2", b"\xc3", b"\xcc\x05", b"\xca\x00\x00\x80\x7f",
                           b"\xa3abc", b"\xc4\x02ab", b"\xd4\x01\x00", b"\xd6\xff\x00\x00\x00\x01",
                           b"\x90", b"\x80"])
    if case == 7:              # numbers at the edges of msgpack's types, float32 ratings
        event["ts"] = rng.choice([2**64 - 1, -2**63, 2**63])
        return msgpack.packb(event, use_bin_type=True, use_single_float=rng.random() < 0.5)
    if case == 8 and _BUDGET["huge_array_message"] < 1:    # thousands of dead letters at once
        _BUDGET["huge_array_message"] += 1
        n = rng.randrange(1_000, 3_000)
        return _pack([rng.choice([None, 1, "x", {}, [], {"kind": "rating"}]) for _ in range(n)])
    if case == 9 and _BUDGET["huge_array_field"] < 6:      # one field of 100k values
        _BUDGET["huge_array_field"] += 1
        event[rng.choice(["user", "event_id", "ts"])] = list(range(100_000))
        return _pack(event)
    if case == 10 and _BUDGET["many_events"] < 3:          # 2,000 valid events in one array
        _BUDGET["many_events"] += 1
        return _pack([_event(rng, i, tag=f"fz{j}m") for i in range(2000)])
    if case == 11 and _BUDGET["dense_features"] < 3:        # 50k valid dense features
        _BUDGET["dense_features"] += 1
        event = _event(rng, j, "outcome")
        event["features"] = [rng.random() for _ in range(50_000)]
        return _pack(event)
    return _pack({**event, "rating": msgpack.ExtType(3, b"5")})


def fam_batch_bad(rng, j):
    kind = rng.choice(KIND_NAMES)
    events = [_event(rng, i, kind, tag=f"fz{j}b") for i in range(rng.randrange(1, 21))]
    batch = msgpack.unpackb(encode_batch(kind, events), raw=False)
    columns, n = batch["columns"], batch["n"]
    name = rng.choice(sorted(columns))
    case = rng.randrange(10)
    fmt = "msgpack"
    if case == 0:
        columns[name] = columns[name][:-1] if rng.random() < 0.5 else columns[name] + [None]
    elif case == 1:
        batch["n"] = rng.choice([n + 1, n - 1, -1, "3", None, 1.5, 2**63, 2**64 - 1, [n]])
        if rng.random() < 0.2:
            del batch["n"]
    elif case == 2:
        columns[name] = rng.choice([{"0": 1}, "abc", 7, None, b"\x00" * n, {}])
    elif case == 3:
        batch["columns"] = rng.choice([list(columns.values()), "columns", None, 5, []])
    elif case == 4:
        batch["batch"] = rng.choice([2, "1", None, 0, 1.0, True, -1, b"\x01"])
    elif case == 5:
        batch["kind"] = rng.choice(ODD_KINDS[:12] + [b"rating"])
        if rng.random() < 0.2:
            del batch["kind"]
    elif case == 6:
        batch["n"], batch["columns"] = 0, {k: [] for k in columns}
    elif case == 7:
        columns[rng.choice(["zzz", 5, None, b"col"])] = [1] * (n + rng.choice([-1, 1, 0]))
    else:                      # a well-formed batch with some bad rows (and odd column names)
        for _ in range(rng.randrange(1, n + 1)):
            i = rng.randrange(n)
            columns[rng.choice(sorted(columns))][i] = rng.choice(
                [None, [], {}, "", -1, "x", float("nan"), b"\xff", 2**64 - 1, "\x00",
                 msgpack.ExtType(1, b"")])
        if rng.random() < 0.3:
            columns["kind"] = ["click"] * n      # ignored: the batch carries the kind
        fmt = rng.choice(["msgpack", "json"])
    try:
        return _json(batch) if fmt == "json" else _pack(batch)
    except (TypeError, ValueError):
        return _pack(batch)


def _broken(rng, event: dict) -> dict:
    name = rng.choice(sorted(event))
    return {**event, name: rng.choice([None, [], {}, "", -5, "five", float("nan"), [[1]]])}


def fam_mixed_array(rng, j):
    fmt = rng.choice(["json", "json", "msgpack"])
    items = []
    for i in range(rng.randrange(1, 13)):
        event = _event(rng, i, tag=f"fz{j}a")
        roll = rng.random()
        if roll < 0.5:
            items.append(event)
        elif roll < 0.75:
            items.append(_broken(rng, event))
        elif roll < 0.85:
            items.append(rng.choice([1, "x", None, True, 2.5, [], {}, [event], "\x00"]))
        else:
            items.append({**event, "kind": rng.choice(ODD_KINDS[:8])})
    return _json(items) if fmt == "json" else _pack(items)


INVALID_UTF8 = [b"\xff", b"\xfe", b"\xc0\x80", b"\xc1\xbf", b"\xed\xa0\x80", b"\xed\xbf\xbf",
                b"\xf4\x90\x80\x80", b"\xf5\x80\x80\x80", b"\xe2\x82", b"\x80", b"\xf0\x9f\x98",
                b"\xf8\x88\x80\x80\x80"]


def fam_invalid_utf8(rng, j):
    seq = rng.choice(INVALID_UTF8)
    event = _event(rng, j)
    case = rng.randrange(5)
    if case == 0:              # inside a string value
        name = rng.choice(["event_id", "user", "kind"]) if "user" in event else "event_id"
        return _spliced(event, name, b'"ab' + seq + b'cd"', "json")
    if case == 1:              # inside a key
        return _json(event)[:-1] + b',"k' + seq + b'":1}'
    if case == 2:              # a byte order mark, or latin-1 text
        return (b"\xef\xbb\xbf" + _json(event) if rng.random() < 0.5
                else json.dumps({**event, "user": "Zo\u00eb"}, ensure_ascii=False)
                .encode("latin-1", errors="replace"))
    if case == 3:              # a msgpack string holding invalid UTF-8
        return _spliced(event, rng.choice(["user", "event_id", "kind"]),
                        bytes([0xa0 | (len(seq) + 2)]) + b"a" + seq + b"b", "msgpack")
    return _json(event)[:rng.randrange(1, 20)] + seq + _json(event)[20:]


def fam_lone_surrogate(rng, j):
    surrogate = rng.choice(["\ud800", "\udfff", "a\udc00b", "\udbff", "x\ud83d"])
    event = _event(rng, j)
    case = rng.randrange(6)
    if case == 0:              # in an id or the kind
        name = rng.choice([n for n in ("event_id", "user", "item", "query", "doc", "winner",
                                       "kind") if n in event])
        event[name] = surrogate if name == "kind" else f"{event[name]}{surrogate}"
    elif case == 1:            # in a feature key or the text
        event = _event(rng, j, "ordinal")
        if rng.random() < 0.5:
            event["text"] = f"t{surrogate}"
        else:
            event["features"] = {f"1{surrogate}": 1.0}
    elif case == 2:            # in a field nobody reads (valid), or in its name
        event[rng.choice(["note", f"n{surrogate}"])] = f"{surrogate}"
    elif case == 3:            # a bad event inside an array of good ones
        event["event_id"] = f"{event['event_id']}{surrogate}"
        good = [_event(rng, i, tag=f"fz{j}a") for i in range(rng.randrange(1, 4))]
        return _json(good + [event])
    elif case == 4:            # a column value of a JSON-encoded column batch
        events = [_event(rng, i, "rating", tag=f"fz{j}b") for i in range(rng.randrange(1, 6))]
        batch = msgpack.unpackb(encode_batch("rating", events), raw=False)
        batch["columns"]["item"][0] = f"i{surrogate}"
        return _json(batch)
    else:                      # the whole message is a string
        return _json(surrogate)
    return _json(event)


def fam_junk_fields(rng, j):
    """Valid events carrying junk in fields nobody reads: they must be stored."""
    fmt = rng.choice(["json", "msgpack"])
    event = _event(rng, j)
    junk = [None, [], {}, float("nan"), "x" * rng.randrange(1, 20_000), [[[[1]]]],
            {"kind": [], "event_id": {}}, -2**63, 2**64 - 1, "\x00"]
    if fmt == "json":
        junk += [10**300, "\ud800"]
    else:
        junk += [b"\xff", msgpack.ExtType(9, b"x"), {1: {None: 2}}]
    event[rng.choice(["extra", "meta", "Kind", "EVENT_ID", "user_id", "_"])] = rng.choice(junk)
    return _json(event) if fmt == "json" else _pack(event)


FAMILIES = {
    "random_bytes": (fam_random_bytes, 1.0),
    "oversize": (fam_oversize, None),          # None: a fixed number per run (slow to move)
    "tombstone": (fam_tombstone, 0.5),
    "huge_int": (fam_huge_int, 1.0),
    "deep_nesting": (fam_deep_nesting, 1.0),
    "medium_nesting": (fam_medium_nesting, 1.0),
    "kind_odd": (fam_kind_odd, 1.0),
    "ids_odd": (fam_ids_odd, 1.0),
    "features_odd": (fam_features_odd, 1.0),
    "ts_odd": (fam_ts_odd, 1.0),
    "msgpack_odd": (fam_msgpack_odd, 1.0),
    "batch_bad": (fam_batch_bad, 1.0),
    "mixed_array": (fam_mixed_array, 1.0),
    "invalid_utf8": (fam_invalid_utf8, 1.0),
    "lone_surrogate": (fam_lone_surrogate, 1.0),
    "junk_fields": (fam_junk_fields, 0.5),
}
N_OVERSIZE = 6


# ---------------------------------------------------------------- messages and the oracle

@dataclass
class Message:
    family: str                  # "good" for the good events between the hostile inputs
    value: bytes | None
    topic: str = ""
    partition: int = -1
    offset: int = -1
    stored: list = field(default_factory=list)     # event ids that must be stored
    dead: list = field(default_factory=list)       # indexes that must be dead letters


def expected_outcome(value: bytes | None, default_kind: str | None
                     ) -> tuple[list[str], list[int]]:
    """(event ids that must be stored, dead-letter indexes) of one message, from the plain
    reference checks; index -1 is the whole message."""
    if value is None or len(value) > MAX_BYTES:
        return [], [-1]
    try:
        obj, _ = decode(value)
    except Exception:          # DecodeError, or what decode() ought to turn into one
        return [], [-1]
    if is_batch(obj):
        try:
            columns, n = batch_columns(obj)
            kind = resolve_kind({k: v for k, v in obj.items() if k == "kind"}, default_kind)
        except Exception:
            return [], [-1]
        if n == 0:
            return [], [-1]
        rows = [{**batch_row(columns, i), "kind": kind} for i in range(n)]
        return _per_event(rows, default_kind, list(range(n)))
    if type(obj) is dict:
        return _per_event([obj], default_kind, [-1])
    if type(obj) is list and obj:
        return _per_event(obj, default_kind, list(range(len(obj))))
    return [], [-1]


def _per_event(rows: list, default_kind, indexes: list[int]) -> tuple[list[str], list[int]]:
    stored, dead = [], []
    for row, index in zip(rows, indexes):
        try:
            ok = check_event(row, default_kind) is None
            event_id = normalize_event(row, default_kind)["event_id"] if ok else None
        except Exception:      # the reference itself chokes: certainly not a valid event
            ok = False
        if ok:
            stored.append(event_id)
        else:
            dead.append(index)
    return stored, dead


# ---------------------------------------------------------------- generating a run

def generate(seed: int, n_fuzz: int, families: list[str]) -> list[Message]:
    """The hostile inputs (``n_fuzz`` of them, every family at least once) and good events
    between them, in production order; topics and partitions are chosen later."""
    rng = random.Random(seed)
    _BUDGET.clear()
    plan = ["oversize"] * min(N_OVERSIZE, n_fuzz) if "oversize" in families else []
    weighted = [(name, w) for name, (_, w) in FAMILIES.items() if name in families and w]
    if weighted:
        names, weights = zip(*weighted)
        plan += list(names) + rng.choices(names, weights,
                                          k=max(0, n_fuzz - len(plan) - len(names)))
    rng.shuffle(plan)
    messages, good_i = [], 0
    for j, name in enumerate(plan):
        if rng.random() < 0.35:
            messages.append(_good_message(rng, good_i))
            good_i += 64
        messages.append(Message(name, FAMILIES[name][0](rng, j)))
    return messages


def _good_message(rng: random.Random, i: int) -> Message:
    roll = rng.random()
    if roll < 0.5:
        return Message("good", _json(_event(rng, i, tag="good"), ascii_only=rng.random() < .5))
    if roll < 0.7:
        return Message("good", _pack(_event(rng, i, tag="good")))
    kind = rng.choice(KIND_NAMES)
    return Message("good", encode_batch(kind, [_event(rng, i + k, kind, tag="good")
                                               for k in range(rng.randrange(1, 20))]))


def produce(bootstrap: str, messages: list[Message], topics: dict[str, str],
            partitions: dict[str, int], rng: random.Random) -> None:
    """Send every message and record where it landed. A tombstone is a null value with a key
    (kafka-python sends no record that has neither)."""
    from kafka import KafkaProducer

    # idempotent: a retried send must not add a message the expectations do not know about
    producer = KafkaProducer(bootstrap_servers=bootstrap, enable_idempotence=True, acks="all",
                             **PRODUCER_CONFIG)
    try:
        futures = []
        for m in messages:
            name = "A" if rng.random() < 0.7 else "B"
            m.topic = topics[name]
            key = None if m.value is not None else f"tombstone-{len(futures)}".encode()
            futures.append(producer.send(m.topic, value=m.value, key=key,
                                         partition=rng.randrange(partitions[name])))
        producer.flush(timeout=120)
        for m, future in zip(messages, futures):
            meta = future.get(timeout=60)
            m.partition, m.offset = meta.partition, meta.offset
    finally:
        producer.close()


# ---------------------------------------------------------------- the census on a crash

def census(messages: list[Message], default_kinds: dict[str, str | None], scratch) -> dict:
    """Per family: the exceptions raised by each hostile input fed alone to a fresh
    PartitionBuffer, and by one flush of the family's surviving inputs into a scratch store.
    ``{family: Counter({"TypeError: ...": count, ...})}`` (families that pass are left out)."""
    found: dict[str, Counter] = defaultdict(Counter)
    by_family: dict[str, list[Message]] = defaultdict(list)
    for m in messages:
        by_family[m.family].append(m)
    for family, members in sorted(by_family.items()):
        keep = PartitionBuffer("census", 0, None, MAX_BYTES)
        for offset, m in enumerate(members):
            buf = PartitionBuffer(m.topic, m.partition, default_kinds[m.topic], MAX_BYTES)
            try:
                buf.add_messages([m.value], [m.offset])
            except Exception as err:
                found[family][_what(err)] += 1
                continue
            keep.default_kind = default_kinds[m.topic]
            try:
                keep.add_messages([m.value], [offset])
            except Exception as err:
                found[family][_what(err)] += 1
        try:
            keep.flush(LocalEventStore(scratch / family / "store", scratch / family / "dead"))
        except Exception as err:
            found[family]["flush: " + _what(err)] += 1
    return dict(found)


def _what(err: BaseException, where: bool = True) -> str:
    """``Type: message`` with numbers shown as N (so that alike errors count together), and
    the innermost line of pipeline code it came from."""
    text = re.sub(r"\d+", "N", " ".join(str(err).split()))[:160]
    frames = [f for f in traceback.extract_tb(err.__traceback__) if "pipeline" in f.filename]
    at = (f" (at {os.path.relpath(frames[-1].filename)}:{frames[-1].lineno} in "
          f"{frames[-1].name})" if frames and where else "")
    return f"{type(err).__name__}: {text}{at}"


# ---------------------------------------------------------------- the test

@pytest.mark.slow
def test_hostile_inputs_never_stop_ingestion_nor_lose_an_event(kafka_bootstrap, tmp_path):
    seed = int(os.environ.get("RANKSTREAM_FUZZ_SEED", time.time_ns() % 1_000_000))
    chosen = [f.strip() for f in os.environ.get("RANKSTREAM_FUZZ_FAMILIES", "").split(",")
              if f.strip()] or list(FAMILIES)
    unknown = set(chosen) - set(FAMILIES)
    assert not unknown, f"unknown families {sorted(unknown)}; known: {sorted(FAMILIES)}"
    print(f"\nfuzz seed {seed} (set RANKSTREAM_FUZZ_SEED={seed} to repeat), {N_FUZZ} hostile "
          f"inputs of {len(chosen)} families")
    repeat = f"[RANKSTREAM_FUZZ_SEED={seed}]"
    started = time.monotonic()

    messages = generate(seed, N_FUZZ, chosen)
    topics = {"A": new_topic(kafka_bootstrap, 2, "fuzz-a"),
              "B": new_topic(kafka_bootstrap, 1, "fuzz-b")}
    default_kinds = {topics[k]: kind for k, kind in DEFAULT_KINDS.items()}
    produce(kafka_bootstrap, messages, topics, {"A": 2, "B": 1}, random.Random(seed + 1))
    for m in messages:
        m.stored, m.dead = expected_outcome(m.value, default_kinds[m.topic])
    refused = [m.offset for m in messages if m.family == "good" and m.dead]
    assert not refused, f"{repeat} the reference refuses good events (offsets {refused[:5]})"
    n_hostile = sum(m.family != "good" for m in messages)
    assert n_hostile >= min(N_FUZZ, 10_000)
    produced_s = time.monotonic() - started

    settings = settings_for(tmp_path / "home", kafka_bootstrap, f"dlq-{topics['A']}")
    store = open_store(settings)
    try:
        summary = ingest_kafka(default_kinds, settings=settings, group_id=new_group_id("fuzz"),
                               until_end=True, flush_events=500, flush_interval=0.2,
                               max_poll_records=250, max_message_bytes=MAX_BYTES,
                               timeout=240, progress=False, check_crcs=False)
    except Exception as err:
        found = census(messages, default_kinds, tmp_path / "census")
        raise AssertionError(
            f"{repeat} ingestion raised {_what(err)}\nstored so far: {store.next_offsets()}\n"
            "census, hostile inputs fed alone to a PartitionBuffer:\n"
            + _format_census(found)) from err
    ingest_s = time.monotonic() - started - produced_s
    assert summary.stopped == "end offsets reached", f"{repeat} {summary}"
    if len(messages) > 5000:
        assert summary.flushes >= 20, f"{repeat} only {summary.flushes} flushes: {summary}"

    problems = check_store(store, messages, topics) + check_dead_letter_files(store, messages)
    problems += check_dead_letter_topic(kafka_bootstrap, settings.dead_letter_topic, messages)
    assert store.segments(complete=False) == [], f"{repeat} unfinished segment groups"
    print(_table(messages))
    print(f"{summary}\nproduce {produced_s:.1f} s, ingest {ingest_s:.1f} s, "
          f"checks {time.monotonic() - started - produced_s - ingest_s:.1f} s")
    assert not problems, f"{repeat}\n" + "\n".join(problems[:60])


def check_store(store: EventStore, messages: list[Message], topics: dict) -> list[str]:
    """Every expected event id stored exactly once, nothing else stored; per family."""
    stored = Counter()
    for kind in KIND_NAMES:
        table = store.read(kind, columns=["event_id"], topics=list(topics.values()))
        stored.update(table.column("event_id").to_pylist())
    expected = Counter(e for m in messages for e in m.stored)
    family_of = {e: m.family for m in messages for e in m.stored}
    lost, example = Counter(), {}
    for e, n in (expected - stored).items():
        lost[family_of[e]] += n
        example.setdefault(family_of[e], e)
    problems = [f"store: {n} valid events of family {family} are lost (e.g. {example[family]!r})"
                for family, n in sorted(lost.items())]
    for e, count in (stored - expected).items():
        if e in expected:
            problems.append(f"store: {e!r} ({family_of[e]}) stored {stored[e]} times")
        else:
            problems.append(f"store: {e!r} stored {count} times but is not a valid event")
    return problems


def check_dead_letter_files(store: EventStore, messages: list[Message]) -> list[str]:
    """Every expected dead letter exactly once in the local files, with a reason; the raw
    bytes of a whole-message dead letter are the message's."""
    by_place = {(m.topic, m.partition, m.offset): m for m in messages}
    found: dict[tuple, Counter] = defaultdict(Counter)
    problems, bad_reason, bad_raw = [], Counter(), Counter()
    for row in store.read_dead_letters().to_pylist():
        place = (row["topic"], row["partition"], row["offset"])
        m = by_place.get(place)
        if m is None:
            problems.append(f"dead-letter files: a dead letter at {place} where nothing was "
                            "produced")
            continue
        found[place][row["index"]] += 1
        if not isinstance(row["reason"], str) or not row["reason"].strip():
            bad_reason[m.family] += 1
        if row["index"] == -1 and m.value is not None and row["raw"] != m.value:
            bad_raw[m.family] += 1
    problems += _compare_dead(messages, found, "dead-letter files")
    problems += [f"dead-letter files: {n} dead letters of family {f} have no reason"
                 for f, n in sorted(bad_reason.items())]
    problems += [f"dead-letter files: {n} whole-message dead letters of family {f} do not keep "
                 "the message's bytes" for f, n in sorted(bad_raw.items())]
    return problems


def check_dead_letter_topic(bootstrap: str, topic: str, messages: list[Message]) -> list[str]:
    """Every expected dead letter on the dead-letter topic (at least once), keyed
    ``topic/partition/offset/index``, with a ``rankstream.reason`` header."""
    found: dict[tuple, Counter] = defaultdict(Counter)
    problems, no_reason = [], 0
    for record in read_topic(bootstrap, topic):
        t, p, o, i = record.key.decode().rsplit("/", 3)
        found[(t, int(p), int(o))][int(i)] = 1          # at least once: duplicates are fine
        reason = dict(record.headers or []).get("rankstream.reason", b"")
        no_reason += not reason.strip()
    if no_reason:
        problems.append(f"dead-letter topic: {no_reason} records without a reason header")
    dedup = [Message(m.family, None, m.topic, m.partition, m.offset, m.stored,
                     sorted(set(m.dead))) for m in messages]
    return problems + _compare_dead(dedup, found, "dead-letter topic")


def read_topic(bootstrap: str, topic: str, timeout_s: float = 120.0) -> list:
    """Every record of a topic (none if it does not exist); CRCs unchecked (pure Python is
    slow at them, and the broker checked them)."""
    from kafka import KafkaConsumer, TopicPartition

    consumer = KafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False,
                             check_crcs=False)
    try:
        parts = [TopicPartition(topic, p) for p in consumer.partitions_for_topic(topic) or ()]
        consumer.assign(parts)
        consumer.seek_to_beginning(*parts)
        ends, records = consumer.end_offsets(parts), []
        deadline = time.monotonic() + timeout_s
        while any(consumer.position(tp) < ends[tp] for tp in parts):
            assert time.monotonic() < deadline, f"could not read {topic} to its end"
            for batch in consumer.poll(timeout_ms=500).values():
                records.extend(batch)
        return records
    finally:
        consumer.close()


def _compare_dead(messages: list[Message], found: dict, where: str) -> list[str]:
    missing, extra, examples = Counter(), Counter(), {}
    seen = set()
    for m in messages:
        place = (m.topic, m.partition, m.offset)
        seen.add(place)
        want, got = Counter(m.dead), found.get(place, Counter())
        if want - got:
            missing[m.family] += sum((want - got).values())
            examples.setdefault(("missing", m.family), (place, dict(want), dict(got)))
        if got - want:
            extra[m.family] += sum((got - want).values())
            examples.setdefault(("unexpected", m.family), (place, dict(want), dict(got)))
    problems = []
    for what, counts in (("missing", missing), ("unexpected or repeated", extra)):
        for family, n in sorted(counts.items()):
            place, want, got = examples[(what.split()[0], family)]
            problems.append(f"{where}: {n} dead letters of family {family} {what} (e.g. at "
                            f"{place}: expected indexes {want}, found {got})")
    problems += [f"{where}: dead letters at {p} where nothing was produced"
                 for p in sorted(set(found) - seen)[:5]]
    return problems


def _format_census(found: dict) -> str:
    if not found:
        return "  (every input passes the buffer alone: the crash is in the Kafka path)"
    return "\n".join(f"  {family}: " + "; ".join(f"{n} x {what}"
                                                for what, n in errors.most_common(4))
                     + (f"; and {len(errors) - 4} other errors" if len(errors) > 4 else "")
                     for family, errors in sorted(found.items()))


def _table(messages: list[Message]) -> str:
    rows = defaultdict(lambda: [0, 0, 0])
    for m in messages:
        row = rows[m.family]
        row[0] += 1
        row[1] += len(m.stored)
        row[2] += len(m.dead)
    lines = [f"{'family':<16}{'messages':>10}{'valid events':>14}{'dead letters':>14}"]
    lines += [f"{family:<16}{a:>10,}{b:>14,}{c:>14,}" for family, (a, b, c) in sorted(rows.items())]
    return "\n".join(lines)


def test_the_oracle_on_known_inputs():
    """The reference oracle itself, on inputs whose fate is known (no broker needed)."""
    good = make_event("rating", 1, random.Random(0))
    assert expected_outcome(_json(good), None) == ([good["event_id"]], [])
    assert expected_outcome(None, "rating") == ([], [-1])
    assert expected_outcome(b"", "rating") == ([], [-1])
    assert expected_outcome(b"1" * 5000, "rating") == ([], [-1])
    assert expected_outcome(b"x" * (MAX_BYTES + 1), "rating") == ([], [-1])
    assert expected_outcome(_json([good, 5, {**good, "kind": []}]), None) == (
        [good["event_id"]], [1, 2])
    batch = encode_batch("rating", [good, {**good, "event_id": "e2", "rating": "five"}])
    assert expected_outcome(batch, None) == ([good["event_id"]], [1])
    assert expected_outcome(_pack({"batch": 1, "kind": "rating", "n": 3, "columns": {
        "event_id": ["a"]}}), None) == ([], [-1])


REFUSED = [("kind", v) for v in ([], ["rating"], {}, 5, 2.5, None, True, "")] + [
    (name, v) for name in ("event_id", "user")
    for v in ([], {}, 1.5, float("nan"), 10**30, "", "a\x00b", "\x00")] + [
    ("ts", v) for v in ("9999-12-31T23:59:59Z", MAX_TS_MS, 10**19, -1, -10**15,
                        "1969-12-31T23:59:59Z", "0001-01-01T00:00:00Z")] + [
    ("features", v) for v in ({"-1": 1.0}, {"99999999999": 1.0}, {"1" * 5000: 1.0},
                              {"abc": 1.0}, {"1.5": 1.0}, {"\u0661": 1.0}, [float("nan")],
                              {"1": float("inf")}, {"1": "NaN"}, {"1": None}, "1,2")]


@pytest.mark.parametrize("name, value", REFUSED,
                         ids=[f"{n}={v!r}"[:48] for n, v in REFUSED])
def test_the_reference_refuses_the_hostile_values(name, value):
    """The families above lean on :func:`check_event`; these values, which the hostile
    inputs are made of, must be refused by it (with a reason, not an exception)."""
    kind = "outcome" if name == "features" else "rating"
    event = {**make_event(kind, 1, random.Random(0), unicode=False), name: value}
    assert check_event(event, "rating"), f"{kind} event with {name}={value!r} was accepted"
