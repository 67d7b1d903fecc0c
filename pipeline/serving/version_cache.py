"""What the lookup client keeps in memory per published version: its meta, item ids, global
list and (loaded on first need) item factors or on-demand scorer. Versions are immutable, so
this is read once per version and process; a version that disappears while being read raises
:class:`Vanished` and the caller re-resolves ``current``.

Item-sized arrays are read a few chunks per round trip (about :data:`TRIP_BYTES` each), not
all in one pipeline: Redis writes a reply while its other clients wait, so one reply of a whole
version's factors (hundreds of MiB for wide factors) would stall every lookup on the server.

Examples
--------
>>> keys = ModelKeys("rankstream", "movies")
>>> st = load_version_state(client, keys, b"7:0a1b2c3d:12")  # doctest: +SKIP
>>> st.version, st.kind, st.n_items  # doctest: +SKIP
(7, 'user_item', 20000)
"""

from __future__ import annotations

import json

import numpy as np
import scipy.sparse as sp

from pipeline.serving.artifact_kinds import KINDS
from pipeline.serving.layout import (
    BUCKETS,
    FORMAT_VERSION,
    MAX_VALUE_BYTES,
    LayoutError,
    ModelKeys,
    decode_pairs,
    parse_pointer,
    unpack_f32,
    unpack_i32,
    unpack_ids,
)
from pipeline.serving.sparse_factors import is_sparse, unpack_rows
from pipeline.serving.version_listing import parse_watermark
from solvers.pairs import popularity_cum

# Bytes of chunks asked for in one round trip when loading a version: one 1 MiB chunk, since
# Redis answers a whole pipeline it has read before it serves another client (4 MiB trips put
# the p99 of lookups beside loading clients at 11-21x idle, 1 MiB trips at 2x; loads as fast).
TRIP_BYTES = 1 << 20

# the version's own answers (a version that serves something else reports that instead); an
# answer from keys the refresher rewrote reports "fresh", whatever the version serves
OWN_SOURCES = ("precomputed", "on_demand", "global", "scored", "fold_in")
STORED_SOURCES = ("precomputed", "global")      # lists written at publish time


class Vanished(Exception):
    """The version was pruned (or replaced) while this process was reading it."""


class VersionState:
    """Immutable in-process data of one published version."""

    __slots__ = ("model", "version", "publish_id", "pointer_prefix", "keys", "pointer_keys",
                 "kind", "per_key", "n_items", "item_ids", "top_k", "rank", "has_bias", "n_lists",
                 "n_factor_keys", "n_keys", "global_items", "global_role", "topk_prefixes",
                 "user_prefixes", "seen_prefixes", "fresh_prefixes", "vkeys", "n_item_chunks",
                 "item_factors", "item_bias", "meta", "scorer", "sources", "fold_in",
                 "global_scores", "item_index", "derived", "watermark", "loser_cum")

    def names(self, pointer: bytes | None) -> bool:
        """Whether a ``current``/bucket pointer value names this version (any epoch)."""
        return pointer is not None and pointer.startswith(self.pointer_prefix)

    def global_answer(self, k: int) -> list:
        return self.global_items[:k] if self.global_items is not None else []

    def index_of(self, item):
        """The index of item id ``item`` in this version (a decimal string names an int64
        id), or None when the version has no such item."""
        if self.item_index is None:
            self.item_index = {x: i for i, x in enumerate(self.item_ids)}
        int_ids = self.meta.get("item_id_type") == "int64"
        if type(item) is str and int_ids:
            try:
                item = int(item)
            except ValueError:
                return None
        elif type(item) is int and not int_ids:
            item = str(item)
        try:
            return self.item_index.get(item)
        except TypeError:   # unhashable: no item has it
            return None


def _ask(client, what: str, fn):
    import redis

    try:
        return fn()
    except redis.ResponseError as err:
        raise LayoutError(f"{what} does not hold what the layout says ({err})") from None


def _int(meta: dict, name: str, key: str) -> int:
    try:
        return int(meta[name])
    except (KeyError, ValueError):
        raise LayoutError(f"{key} field {name!r} is {meta.get(name)!r}, expected an "
                          "integer") from None


def load_version_state(client, keys: ModelKeys, current_raw: bytes,
                       key: str | None = None) -> VersionState:
    """Read meta, item ids and the global list of the version ``current_raw`` (a value of
    ``current`` or of a bucket pointer, read from ``key``) names."""
    version, publish_id, _ = parse_pointer(current_raw, key or keys.current)
    vk = keys.version(version)
    raw = _ask(client, vk.meta, lambda: client.hgetall(vk.meta))
    if not raw:
        raise Vanished(version)
    try:
        meta = {k.decode(): v.decode() for k, v in raw.items()}
    except UnicodeDecodeError:
        raise LayoutError(f"{vk.meta} has fields that are not UTF-8") from None
    fmt = meta.get("format_version")
    if fmt != str(FORMAT_VERSION):
        raise LayoutError(f"{vk.meta} has format_version {fmt!r}, this client reads format "
                          f"{FORMAT_VERSION} (see pipeline/serving/REDIS_LAYOUT.md)")
    if meta.get("publish_id") != publish_id or meta.get("status") != "complete":
        raise Vanished(version)  # replaced or being deleted since current was read
    if meta.get("kind") not in KINDS:
        raise LayoutError(f"{vk.meta} has kind {meta.get('kind')!r}, expected one of "
                          f"{tuple(KINDS)}")
    if meta.get("buckets") != str(BUCKETS):
        raise LayoutError(f"{vk.meta} has buckets {meta.get('buckets')!r}, format "
                          f"{FORMAT_VERSION} has {BUCKETS}")
    st = VersionState()
    st.meta = meta
    st.model, st.version, st.publish_id = keys.model, version, publish_id
    st.pointer_prefix = f"{version}:{publish_id}:".encode()
    st.keys, st.vkeys, st.pointer_keys = keys, vk, keys.pointers
    st.kind = meta["kind"]
    st.per_key = KINDS[st.kind].per_key
    for name in ("n_items", "top_k", "rank", "n_lists", "n_factor_keys", "n_keys",
                 "n_item_chunks"):
        setattr(st, name, _int(meta, name, vk.meta))
    st.has_bias = meta.get("has_item_bias") == "1"
    st.global_role = meta.get("global", "none")
    served_as = meta.get("served_as", "model")
    # the source a lookup reports: how the answer came about; a version that serves a trivial
    # list, a challenger or a blend says that for its stored lists, and both for an answer
    # made now ("blend-als:fold_in"), so that what served and how stay apart
    st.sources = {s: (s if served_as == "model" else
                      served_as if s in STORED_SOURCES else f"{served_as}:{s}")
                  for s in OWN_SOURCES}
    st.topk_prefixes = [p + "topk:" for p in vk.bucket_prefixes]
    st.user_prefixes = [p + "u:" for p in vk.bucket_prefixes]
    st.seen_prefixes = [p + "seen:" for p in vk.bucket_prefixes]
    st.fresh_prefixes = [p + "fresh:" for p in vk.bucket_prefixes]
    st.item_factors = st.item_bias = st.scorer = st.global_scores = st.item_index = None
    st.loser_cum = None
    st.derived = {}
    try:
        st.fold_in = json.loads(meta.get("fold_in") or "{}")
    except ValueError:
        raise LayoutError(f"{vk.meta} field 'fold_in' is not JSON") from None
    st.watermark = parse_watermark(meta.get("watermark"), vk.meta)
    id_bytes = 8 if meta.get("item_id_type") == "int64" else 64   # a guess for strings
    chunks = read_chunks(client, [vk.items(c) for c in range(st.n_item_chunks)],
                         _chunk_rows(meta) * id_bytes, version)
    global_raw = _ask(client, vk.global_list, lambda: client.get(vk.global_list))
    ids: list = []
    for c, value in enumerate(chunks):
        ids += unpack_ids(value, meta.get("item_id_type", "?"), vk.items(c))
    if len(ids) != st.n_items:
        raise LayoutError(f"{vk.prefix}items:* hold {len(ids)} ids, meta says n_items="
                          f"{st.n_items}")
    st.item_ids = ids
    st.global_items = None
    if st.global_role != "none":
        if global_raw is None:
            raise Vanished(version)
        pairs = decode_pairs(global_raw, vk.global_list, st.n_items)
        st.global_items = list(zip([ids[i] for i in pairs["index"].tolist()],
                                   pairs["score"].tolist()))
    return st


def _chunk_rows(meta: dict) -> int:
    """Rows per item chunk of a version (65536 for versions published before it varied)."""
    try:
        return max(1, int(meta.get("item_chunk", 65536)))
    except ValueError:
        raise LayoutError(f"meta field 'item_chunk' is {meta.get('item_chunk')!r}, expected "
                          "an integer") from None


def read_chunks(client, names: list[str], value_bytes: int, version: int,
                per: int = 1) -> list[bytes]:
    """``GET`` of every key of ``names`` (chunks of one version, ``value_bytes`` each at most
    for ``per`` consecutive keys) in round trips of about :data:`TRIP_BYTES`; :class:`Vanished`
    when one is gone, :class:`LayoutError` when one is not a string."""
    step = per * max(1, TRIP_BYTES // max(1, value_bytes))
    out: list = []
    for lo in range(0, len(names), step):
        batch = names[lo:lo + step]
        pipe = client.pipeline(transaction=False)
        for name in batch:
            pipe.get(name)
        replies = pipe.execute(raise_on_error=False)
        for name, r in zip(batch, replies):
            if isinstance(r, Exception):
                raise LayoutError(f"{name} does not hold what the layout says ({r})")
            if r is None:
                raise Vanished(version)
        out += replies
    return out


def load_factors(client, st: VersionState) -> tuple[np.ndarray, np.ndarray | None]:
    """Item factors (n_items x rank float32; a CSR matrix for a version with sparse factors)
    and bias of a version, read once and kept; with them, where the version has them, the
    weights its fold-in draws popularity-sampled losers by (``st.loser_cum``:
    :func:`solvers.pairs.popularity_cum` of its ``loser_counts``, training's rule)."""
    if st.item_factors is not None:
        return st.item_factors, st.item_bias
    if st.rank == 0:
        raise LayoutError(f"model {st.model!r} version {st.version} has no factors")
    vk = st.vkeys
    names = []
    for c in range(st.n_item_chunks):
        names.append(vk.item_factors(c))
        if st.has_bias:
            names.append(vk.item_bias(c))
    rows, sparse = _chunk_rows(st.meta), is_sparse(st.meta)
    replies = read_chunks(client, names, rows * 4 * (st.rank + st.has_bias) if not sparse
                          else MAX_VALUE_BYTES, st.version, per=2 if st.has_bias else 1)
    step = 2 if st.has_bias else 1
    if sparse:     # chunks of CSR rows (sparse_factors.py): one matrix
        V = sp.vstack([unpack_rows(r, vk.item_factors(c), min(rows, st.n_items - c * rows),
                                   st.rank) for c, r in enumerate(replies[::step])],
                      format="csr")
    else:
        V = np.concatenate([unpack_f32(r, vk.item_factors(c), st.rank)
                            for c, r in enumerate(replies[::step])])
    b = (np.concatenate([unpack_f32(r, vk.item_bias(c)) for c, r in enumerate(replies[1::2])])
         if st.has_bias else None)
    if V.shape != (st.n_items, st.rank) or (b is not None and b.shape != (st.n_items,)):
        raise LayoutError(f"{vk.prefix}V:* hold {V.shape} factors, meta says "
                          f"({st.n_items}, {st.rank})")
    if st.meta.get("has_loser_counts") == "1":
        counts = np.concatenate([unpack_i32(r, vk.loser_counts(c)) for c, r in enumerate(
            read_chunks(client, [vk.loser_counts(c) for c in range(st.n_item_chunks)],
                        rows * 4, st.version))])
        if counts.shape != (st.n_items,) or (counts.size and counts.min() < 0):
            raise LayoutError(f"{vk.prefix}lc:* hold {counts.shape} counts (least "
                              f"{counts.min(initial=0)}), meta says {st.n_items} items, "
                              "counts >= 0")
        st.loser_cum = popularity_cum(counts, st.n_items)
    st.item_factors, st.item_bias = V, b
    return V, b


def load_global_scores(client, st: VersionState) -> np.ndarray | None:
    """The score of every item the global list ranks by (float32), read once and kept; None
    for a version without them (``has_global_scores`` not 1: the global list is all it
    ranks)."""
    if st.global_scores is not None or st.meta.get("has_global_scores") != "1":
        return st.global_scores
    replies = read_chunks(client, [st.vkeys.global_scores(c) for c in range(st.n_item_chunks)],
                          _chunk_rows(st.meta) * 4, st.version)
    scores = np.concatenate([unpack_f32(r, st.vkeys.global_scores(c))
                             for c, r in enumerate(replies)])
    if scores.shape != (st.n_items,):
        raise LayoutError(f"{st.vkeys.prefix}gs:* hold {scores.size} scores, meta says "
                          f"n_items={st.n_items}")
    st.global_scores = scores
    return scores


def load_scorer(client, st: VersionState):
    """The version's on-demand :class:`~pipeline.serving.scorers.Scorer`, read once and kept."""
    if st.scorer is not None:
        return st.scorer
    from pipeline.serving.scorers import Scorer

    if st.meta.get("scorer", "none") == "none":
        raise LayoutError(f"model {st.model!r} version {st.version} ({st.kind}) has no scorer: "
                          "it cannot score candidates given in a request")
    raw = _ask(client, st.vkeys.scorer, lambda: client.get(st.vkeys.scorer))
    if raw is None:
        raise Vanished(st.version)
    st.scorer = Scorer.from_bytes(raw, st.vkeys.scorer)
    return st.scorer
