"""The Redis key layout and value encodings of published models: the code side of the contract
written down in ``pipeline/serving/REDIS_LAYOUT.md`` (``tests/serving/test_layout.py`` checks
that the two agree).

Model-level keys (the ``current`` pointer, the version list, each version's meta, item ids,
factors and global list) carry the Redis Cluster hash tag ``{<namespace>:<model>}``: one slot,
read once per version. Per-user/per-query keys (top-K lists, user factors, seen lists) and the
key index carry a *bucket* tag ``{<namespace>:<model>:<bucket>}`` with ``bucket = crc32(key)
mod BUCKETS``, so one version spreads over every slot of a cluster; each bucket has its own
copy of the ``current`` pointer, read in the same ``MGET`` as the list (same slot, atomic).
Values are packed little-endian (float32 / int32 / int64) byte strings; see
:data:`KEY_PATTERNS` and :data:`META_FIELDS`, and :data:`VALUE_BOUNDS` for how big each can
get.

Examples
--------
>>> keys = ModelKeys("rankstream", "movies")
>>> keys.current
'{rankstream:movies}:current'
>>> bucket_of("alice"), keys.pointer(bucket_of("alice"))
(87, '{rankstream:movies:87}:current')
>>> keys.version(7).topk("alice")
'{rankstream:movies:87}:v7:topk:alice'
>>> unpack_pairs(pack_pairs([3, 1], [0.5, 0.25]))
([3, 1], [0.5, 0.25])
"""

from __future__ import annotations

import json
import re
import struct
import zlib
from dataclasses import dataclass
from functools import cached_property

import numpy as np

from pipeline.naming import check_name
from pipeline.serving.layout_tables import (  # noqa: F401  the contract's tables, re-exported
    FRESH_KEY_PATTERNS,
    KEY_PATTERNS,
    META_FIELDS,
    VALUE_BOUNDS,
)

FORMAT_VERSION = 2
"""Bumped whenever a key or value encoding changes; readers refuse other versions."""

BUCKETS = 1024
"""Buckets of per-key keys (a power of two); see :func:`bucket_of`. Part of the format: a reader
finds a key's bucket pointer before it knows the version."""

BUCKET_MIX = 2654435761
"""Odd multiplier (Knuth's, ~2**32 / golden ratio) that mixes a key's CRC-32 into its bucket."""
BUCKET_SHIFT = 32 - (BUCKETS.bit_length() - 1)

MAX_VALUE_BYTES = 1 << 20
"""The most bytes a chunked value holds (item arrays, key index): see :data:`VALUE_BOUNDS`.
Redis runs one command at a time, and writing or reading a value costs it time in proportion
to its size, which every other client then waits for."""

PAIR_DTYPE = np.dtype([("index", "<i4"), ("score", "<f4")])
"""One entry of a ranked list: item index (into the version's item ids) and its score."""

_POINTER = re.compile(rb"^([1-9][0-9]{0,17}):([0-9a-f]{8,32}):([1-9][0-9]{0,17})$")
_FORMAT_1 = re.compile(rb"^[1-9][0-9]{0,17}:[0-9a-f]{8,32}$")


class LayoutError(ValueError):
    """A key under the namespace holds something this layout does not produce."""


class UnknownModelError(LookupError):
    """The model has no published version (no ``current`` key) under the namespace."""


def parse_pointer(raw: bytes, key: str) -> tuple[int, str, int]:
    """Split a ``current`` (or bucket pointer) value into (version, publish_id, epoch);
    :class:`LayoutError` if malformed, saying so plainly for a format 1 value.

    Examples
    --------
    >>> parse_pointer(b"7:0a1b2c3d:12", "{ns:m}:current")
    (7, '0a1b2c3d', 12)
    """
    match = _POINTER.match(raw) if isinstance(raw, bytes) else None
    if match is None:
        if isinstance(raw, bytes) and _FORMAT_1.match(raw):
            raise LayoutError(f"{key} holds {raw.decode()!r}, written by a format 1 publisher; "
                              f"this client reads format {FORMAT_VERSION}: publish the model "
                              "again with this version of rankstream")
        raise LayoutError(f"{key} holds {raw[:40]!r}, expected '<version>:<publish_id>:<epoch>' "
                          f"as written by rankstream publish (format {FORMAT_VERSION})")
    return int(match.group(1)), match.group(2).decode(), int(match.group(3))


def parse_current(raw: bytes, key: str) -> tuple[int, str]:
    """(version, publish_id) of a ``current`` value; :class:`LayoutError` if malformed.

    Examples
    --------
    >>> parse_current(b"7:0a1b2c3d:12", "{ns:m}:current")
    (7, '0a1b2c3d')
    """
    return parse_pointer(raw, key)[:2]


def bucket_of(key: str) -> int:
    """Bucket of a user/query key: the top 10 bits of ``crc32(key) * 2654435761 mod 2**32``
    (zlib's CRC-32 of the UTF-8 bytes). CRC-32 alone is linear over GF(2): structured ids
    (``10*i + 1``, say) can fill only part of its low bits; the multiplication mixes every
    bit of the CRC into the top ones, so buckets fill like a random hash's.

    Examples
    --------
    >>> bucket_of("alice"), bucket_of("42")
    (87, 896)
    """
    return ((zlib.crc32(key.encode()) * BUCKET_MIX) & 0xFFFFFFFF) >> BUCKET_SHIFT


@dataclass(frozen=True)
class VersionKeys:
    """Key names of one published version: model-level keys share the model's hash tag,
    per-key keys the tag of their bucket."""

    base: str  # "ns:model"
    version: int

    @cached_property
    def prefix(self) -> str:
        """Prefix of the version's model-level keys: ``{ns:model}:v7:``."""
        return "{" + self.base + "}:v" + str(self.version) + ":"

    def bucket_prefix(self, bucket: int) -> str:
        """Prefix of the version's keys in ``bucket``: ``{ns:model:17}:v7:``."""
        return "{" + self.base + ":" + str(bucket) + "}:v" + str(self.version) + ":"

    @cached_property
    def bucket_prefixes(self) -> list[str]:
        """:meth:`bucket_prefix` of every bucket."""
        return [self.bucket_prefix(b) for b in range(BUCKETS)]

    @property
    def meta(self) -> str:
        return self.prefix + "meta"

    @property
    def global_list(self) -> str:
        return self.prefix + "global"

    def items(self, chunk: int) -> str:
        return f"{self.prefix}items:{chunk}"

    def item_factors(self, chunk: int) -> str:
        return f"{self.prefix}V:{chunk}"

    def item_bias(self, chunk: int) -> str:
        return f"{self.prefix}b:{chunk}"

    def item_values(self, chunk: int) -> str:
        return f"{self.prefix}val:{chunk}"

    def global_scores(self, chunk: int) -> str:
        return f"{self.prefix}gs:{chunk}"

    def loser_counts(self, chunk: int) -> str:
        return f"{self.prefix}lc:{chunk}"

    @property
    def scorer(self) -> str:
        return self.prefix + "scorer"

    def key_index(self, bucket: int, chunk: int) -> str:
        return f"{self.bucket_prefix(bucket)}keys:{chunk}"

    def topk(self, key: str) -> str:
        return f"{self.bucket_prefixes[bucket_of(key)]}topk:{key}"

    def user_factor(self, key: str) -> str:
        return f"{self.bucket_prefixes[bucket_of(key)]}u:{key}"

    def seen(self, key: str) -> str:
        return f"{self.bucket_prefixes[bucket_of(key)]}seen:{key}"

    def fresh(self, key: str) -> str:
        return f"{self.bucket_prefixes[bucket_of(key)]}fresh:{key}"

    def fresh_keys(self, bucket: int) -> str:
        return f"{self.bucket_prefix(bucket)}fresh_keys"


@dataclass(frozen=True)
class ModelKeys:
    """Key names of one model under one namespace.

    Examples
    --------
    >>> ModelKeys("ns", "m").tag, ModelKeys("ns", "m").bucket_tag(3)
    ('{ns:m}', '{ns:m:3}')
    """

    namespace: str
    model: str

    def __post_init__(self):
        check_name("namespace", self.namespace)
        check_name("model name", self.model)

    @property
    def tag(self) -> str:
        return "{" + self.namespace + ":" + self.model + "}"

    def bucket_tag(self, bucket: int) -> str:
        return "{" + self.namespace + ":" + self.model + ":" + str(int(bucket)) + "}"

    @property
    def current(self) -> str:
        return self.tag + ":current"

    @property
    def epoch(self) -> str:
        return self.tag + ":epoch"

    def pointer(self, bucket: int) -> str:
        return self.bucket_tag(bucket) + ":current"

    @cached_property
    def pointers(self) -> list[str]:
        """:meth:`pointer` of every bucket, indexed by bucket."""
        return [self.pointer(b) for b in range(BUCKETS)]

    @property
    def versions(self) -> str:
        return self.tag + ":versions"

    @property
    def seq(self) -> str:
        return self.tag + ":seq"

    @property
    def pending(self) -> str:
        return self.tag + ":pending"

    @property
    def lookups(self) -> str:
        return self.tag + ":lookups"

    @property
    def lease(self) -> str:
        return self.tag + ":lease"

    @property
    def lease_seq(self) -> str:
        return self.tag + ":lease_seq"

    def version(self, version: int) -> VersionKeys:
        return VersionKeys(self.namespace + ":" + self.model, int(version))


# ----------------------------------------------------------------------------- value encodings

def pack_pairs(indices, scores) -> bytes:
    """Ranked list -> bytes: interleaved (int32 index, float32 score) little-endian pairs.

    Examples
    --------
    >>> pack_pairs([2], [1.0]).hex()
    '020000000000803f'
    """
    indices = np.asarray(indices)
    out = np.empty(len(indices), dtype=PAIR_DTYPE)
    out["index"] = indices
    out["score"] = scores
    return out.tobytes()


def unpack_pairs(value: bytes, n_items: int | None = None) -> tuple[list[int], list[float]]:
    """Bytes -> (indices, scores); :class:`LayoutError` when the value cannot be a ranked list.

    Examples
    --------
    >>> unpack_pairs(bytes.fromhex("020000000000803f"))
    ([2], [1.0])
    """
    arr = decode_pairs(value, "value", n_items)
    return arr["index"].tolist(), arr["score"].tolist()


def decode_pairs(value: bytes, key: str, n_items: int | None = None) -> np.ndarray:
    """Bytes -> structured array of :data:`PAIR_DTYPE`, checked (length, index range)."""
    if not isinstance(value, (bytes, bytearray, memoryview)) or len(value) % PAIR_DTYPE.itemsize:
        size = len(value) if isinstance(value, (bytes, bytearray, memoryview)) else "?"
        raise LayoutError(f"{key} holds {size} bytes, not a multiple of {PAIR_DTYPE.itemsize} "
                          "(int32 index, float32 score) pairs")
    arr = np.frombuffer(value, dtype=PAIR_DTYPE)
    if n_items is not None and len(arr):
        idx = arr["index"]
        if idx.min() < 0 or idx.max() >= n_items:
            raise LayoutError(f"{key} lists item index {int(idx.max())} or {int(idx.min())}, "
                              f"outside the version's {n_items} items")
    return arr


def pair_struct(n: int) -> struct.Struct:
    """``struct`` format for ``n`` pairs read as (uint32 index, float32 score): a negative
    (corrupt) index then shows up as a huge one and fails the item lookup instead of wrapping."""
    return struct.Struct("<" + "If" * n)


def pack_f32(values) -> bytes:
    """float32 little-endian bytes (C order)."""
    return np.ascontiguousarray(values, dtype="<f4").tobytes()


def unpack_f32(value: bytes, key: str, per_row: int = 1) -> np.ndarray:
    """Bytes -> float32 array (rows x ``per_row`` when ``per_row`` > 1); checked length."""
    if not isinstance(value, bytes) or len(value) % (4 * per_row):
        size = len(value) if isinstance(value, bytes) else type(value).__name__
        raise LayoutError(f"{key} holds {size} bytes, expected a multiple of {4 * per_row} "
                          f"(float32 rows of {per_row})")
    arr = np.frombuffer(value, dtype="<f4")
    return arr.reshape(-1, per_row) if per_row > 1 else arr


def pack_i32(values) -> bytes:
    """int32 little-endian bytes."""
    return np.ascontiguousarray(values, dtype="<i4").tobytes()


def unpack_i32(value: bytes, key: str) -> np.ndarray:
    """Bytes -> int32 array; checked length."""
    if not isinstance(value, bytes) or len(value) % 4:
        raise LayoutError(f"{key} is not packed int32 values")
    return np.frombuffer(value, dtype="<i4")


def pack_ids(ids: np.ndarray) -> bytes:
    """Item ids -> bytes: int64 LE when integer, else a UTF-8 JSON array of strings."""
    if ids.dtype.kind in "iu":
        return np.ascontiguousarray(ids, dtype="<i8").tobytes()
    return json.dumps([str(x) for x in ids.tolist()], ensure_ascii=False).encode()


def unpack_ids(value: bytes, id_type: str, key: str) -> list:
    """Bytes -> list of ids (ints or strings), as written by :func:`pack_ids`."""
    try:
        if id_type == "int64":
            if len(value) % 8:
                raise ValueError("length is not a multiple of 8")
            return np.frombuffer(value, dtype="<i8").tolist()
        if id_type == "str":
            ids = json.loads(value)
            if not isinstance(ids, list) or not all(isinstance(x, str) for x in ids):
                raise ValueError("not a JSON array of strings")
            return ids
    except (ValueError, TypeError) as err:
        raise LayoutError(f"{key} does not hold {id_type} ids: {err}") from None
    raise LayoutError(f"{key}: unknown item_id_type {id_type!r} (expected int64 or str)")


def pack_keys(keys: list[str]) -> bytes:
    """User/query keys of a key_index chunk -> UTF-8 JSON array."""
    return json.dumps(keys, ensure_ascii=False).encode()


def unpack_keys(value: bytes, key: str) -> list[str]:
    """Inverse of :func:`pack_keys`."""
    return unpack_ids(value, "str", key)


def key_of(external_id) -> str:
    """The key suffix of a user/query id: ``str`` of it (ints as decimal).

    Examples
    --------
    >>> key_of(42), key_of("alice")
    ('42', 'alice')
    """
    if isinstance(external_id, (bool, np.bool_)):
        raise TypeError(f"user/query id {external_id!r} is a bool, expected a str or int")
    if isinstance(external_id, (int, np.integer)):
        return str(int(external_id))
    if isinstance(external_id, str) and external_id:
        return external_id
    raise TypeError(f"user/query id {external_id!r} is not a non-empty str or an int")
