"""The serving shapes a published model takes, one :class:`ArtifactKind` each, registered by
name in :data:`KINDS`: the kind's own data (a small dataclass, its ``payload``, which a
:class:`~pipeline.serving.artifact.ModelArtifact` of the kind carries as ``data``), how it is
built and checked, how many keys it writes, its list for everyone, how its per-key lists are
written, and whether lookups read it per key. A family with a new serving shape adds its
payload and one class here and registers it (and its row in ``REDIS_LAYOUT.md``); the
artifact, the publisher and the lookup client ask the registry.

=====================  ==============================================================
``user_item``          user factors U, item factors V (dense, or both CSR: an item-kNN's),
                       optional item bias b and seen items per user (CSR): per-user top-K
                       of ``U @ V.T + b``
``global_list``        one score per candidate item: one ranked list
``query_docs``         per query a list of (doc, score), ranked per query
``predicted_ratings``  one predicted rating per item: one ranked list
=====================  ==============================================================

Examples
--------
>>> kind_of("user_item").per_key, kind_of("global_list").needs
(True, ('item_scores',))
>>> item_ids, data = kind_of("global_list").build(item_ids=["a", "b"], scores=[0.1, 0.9])
>>> data
GlobalListData(item_scores=[0.1, 0.9])
"""

from __future__ import annotations

import time
from dataclasses import dataclass, fields

import numpy as np
import scipy.sparse as sp

from pipeline.serving.layout import PAIR_DTYPE, key_of, pack_f32, pack_i32, pack_pairs
from pipeline.serving.plugins import add_entry
from solvers.topk import user_topk_blocks

# ---------------------------------------------------------------------- each kind's data
# The arrays are stored under their field names (``arrays.npz`` of an artifact bundle).

@dataclass(eq=False)
class GlobalListData:
    """``global_list``: one score per item."""

    item_scores: np.ndarray | None = None


@dataclass(eq=False)
class PredictedRatingsData:
    """``predicted_ratings``: a predicted rating per item and the continuous ranking score
    the published list is ordered by (``fallback_scores``; default the ratings)."""

    item_scores: np.ndarray | None = None
    fallback_scores: np.ndarray | None = None


@dataclass(eq=False)
class UserItemData:
    """``user_item``: float32 U (n_keys x rank) of the users ``key_ids``, V (n_items x rank)
    (both dense arrays, or both CSR matrices: :mod:`~pipeline.serving.sparse_factors`),
    optional b (n_items,); the CSR of the item indices each user has seen (left out of their
    lists); ``precompute``, a bool mask over users (which get a precomputed list; default
    all, the others are scored on demand); ``fallback_scores`` of the list for unknown users
    (default the mean user's); ``loser_counts``, how many users met each item: the counts a
    fold-in draws popularity-sampled losers by, as training drew its own
    (:func:`solvers.pairs.popularity_cum`)."""

    key_ids: np.ndarray | None = None
    user_factors: np.ndarray | None = None
    item_factors: np.ndarray | None = None
    item_bias: np.ndarray | None = None
    seen_indptr: np.ndarray | None = None
    seen_indices: np.ndarray | None = None
    precompute: np.ndarray | None = None
    fallback_scores: np.ndarray | None = None
    loser_counts: np.ndarray | None = None


@dataclass(eq=False)
class QueryDocsData:
    """``query_docs``: per query of ``key_ids`` its candidate docs (indices into the item ids)
    with their scores, in CSR form; ``fallback_scores`` of the list for unknown queries."""

    key_ids: np.ndarray | None = None
    list_indptr: np.ndarray | None = None
    list_items: np.ndarray | None = None
    list_scores: np.ndarray | None = None
    fallback_scores: np.ndarray | None = None


ITEM_VECTORS = ("item_scores", "fallback_scores")   # one value per item, where a kind has them


class ArtifactKind:
    """One serving shape (see the module docstring); the defaults fit a single global list."""

    name = ""
    payload: type = GlobalListData   # the dataclass of the kind's own fields
    needs: tuple[str, ...] = ()      # the payload fields the kind cannot do without
    per_key = False                  # lookups read a list per user or query key

    def build(self, *, item_ids, **given) -> tuple:
        """``(item_ids, payload)`` from the keywords a trainer gives (by default the payload's
        own field names)."""
        return item_ids, self.payload(**given)

    def validate(self, art) -> None:
        """Check and normalise the kind's own fields in place (``ValueError`` naming them); the
        base checks the one-value-per-item vectors."""
        d = art.data
        for name in ITEM_VECTORS:
            if getattr(d, name, None) is not None:
                setattr(d, name, floats(name, getattr(d, name), (art.n_items,)))

    def counts(self, art) -> dict:
        """The meta hash's ``n_lists``, ``n_factor_keys``, ``n_seen_keys``."""
        return {"n_lists": 0, "n_factor_keys": 0, "n_seen_keys": 0}

    def global_scores(self, art) -> tuple[np.ndarray | None, str]:
        """Per-item scores of the list served to everyone and its role (``"model"``: the
        model's own list, ``"fallback"``: for unknown keys, ``"none"``)."""
        scores = getattr(art.data, "fallback_scores", None)
        if scores is not None:
            return scores, "fallback"
        return None, "none"

    def write_lists(self, w, vk, art, key_strs: list[str], buckets: np.ndarray, top_k: int,
                    progress) -> float:
        """Write the per-key lists through the shard writer ``w``; returns the seconds spent
        waiting for their top-K computation."""
        return 0.0


class GlobalList(ArtifactKind):
    """``build(item_ids=, scores=)``: one score per candidate item (TopPush): one ranked list
    for everyone."""

    name = "global_list"
    payload = GlobalListData
    needs = ("item_scores",)

    def build(self, *, item_ids, scores):
        return item_ids, GlobalListData(item_scores=scores)

    def global_scores(self, art):
        return art.data.item_scores, "model"


class PredictedRatings(ArtifactKind):
    """``build(item_ids=, ratings=, scores=None)``: one predicted rating per item (NPSVOR);
    the published list ranks items by ``scores`` (default the ratings themselves)."""

    name = "predicted_ratings"
    payload = PredictedRatingsData
    needs = ("item_scores",)

    def build(self, *, item_ids, ratings, scores=None):
        return item_ids, PredictedRatingsData(item_scores=ratings, fallback_scores=scores)

    def global_scores(self, art):
        # ranked by the continuous ranking score when there is one, not by the rating
        d = art.data
        return (d.item_scores if d.fallback_scores is None else d.fallback_scores), "model"


class UserItem(ArtifactKind):
    """``build(user_ids=, item_ids=, user_factors=, item_factors=, item_bias=None, seen=None,
    precompute=None, fallback_scores=None)``: a user x item factor model (AltSVM). ``seen``:
    a scipy CSR matrix (users x items) or an ``(indptr, indices)`` pair; ``precompute``: a
    bool mask or a list of the user ids that get a precomputed list (default all)."""

    name = "user_item"
    payload = UserItemData
    needs = ("key_ids", "user_factors", "item_factors")
    per_key = True

    def build(self, *, user_ids, item_ids, user_factors, item_factors, item_bias=None,
              seen=None, precompute=None, fallback_scores=None, loser_counts=None):
        if seen is not None and hasattr(seen, "indptr"):
            seen = (seen.indptr, seen.indices)
        if precompute is not None and np.asarray(precompute).dtype != bool:
            wanted = {key_of(u) for u in np.asarray(precompute).tolist()}
            precompute = np.array([key_of(u) in wanted for u in np.asarray(user_ids).tolist()],
                                  dtype=bool)
        return item_ids, UserItemData(
            key_ids=user_ids, user_factors=user_factors, item_factors=item_factors,
            item_bias=item_bias, seen_indptr=None if seen is None else seen[0],
            seen_indices=None if seen is None else seen[1], precompute=precompute,
            fallback_scores=fallback_scores, loser_counts=loser_counts)

    def validate(self, art) -> None:
        super().validate(art)
        d, n_keys, n_items = art.data, art.n_keys, art.n_items
        if sp.issparse(d.user_factors) or sp.issparse(d.item_factors):
            # an item-kNN's (or a blend with one): both stored sparsely (sparse_factors.py)
            rank = d.item_factors.shape[1] if len(d.item_factors.shape) == 2 else -1
            d.user_factors = sparse_floats("user_factors", d.user_factors, (n_keys, rank))
            d.item_factors = sparse_floats("item_factors", d.item_factors, (n_items, rank))
        else:
            fac = np.asarray(d.user_factors)
            rank = fac.shape[1] if fac.ndim == 2 else -1
            d.user_factors = floats("user_factors", fac, (n_keys, rank))
            d.item_factors = floats("item_factors", d.item_factors, (n_items, rank))
        if d.item_bias is not None:
            d.item_bias = floats("item_bias", d.item_bias, (n_items,))
        if (d.seen_indptr is None) != (d.seen_indices is None):
            raise ValueError("seen needs both indptr and indices")
        if d.seen_indptr is not None:
            d.seen_indptr, d.seen_indices = csr("seen", d.seen_indptr, d.seen_indices,
                                                n_keys, n_items)
        if d.precompute is not None:
            d.precompute = np.asarray(d.precompute, dtype=bool)
            if d.precompute.shape != (n_keys,):
                raise ValueError(f"precompute has shape {d.precompute.shape}, expected "
                                 f"({n_keys},) (one flag per user)")
        if d.loser_counts is not None:
            c = np.asarray(d.loser_counts)
            if c.shape != (n_items,) or c.dtype.kind not in "iu" or (
                    c.size and (c.min() < 0 or c.max() >= 2**31)):
                raise ValueError(f"loser_counts has shape {c.shape} and dtype {c.dtype}, "
                                 f"expected ({n_items},) counts in [0, 2**31) (one per item)")
            d.loser_counts = c.astype(np.int32)

    def counts(self, art) -> dict:
        d = art.data
        return {"n_lists": art.n_keys if d.precompute is None else int(d.precompute.sum()),
                "n_factor_keys": art.n_keys,
                "n_seen_keys": 0 if d.seen_indptr is None
                else int((np.diff(d.seen_indptr) > 0).sum())}

    def global_scores(self, art):
        d = art.data
        if d.fallback_scores is not None:
            return d.fallback_scores, "fallback"
        mean = np.asarray(d.user_factors.mean(axis=0, dtype=np.float64)).ravel()
        scores = np.asarray(d.item_factors @ mean).ravel()
        if d.item_bias is not None:      # the mean user's list
            scores = scores + d.item_bias
        return scores.astype(np.float32), "fallback"

    def write_lists(self, w, vk, art, key_strs, buckets, top_k, progress) -> float:
        """Per-user factors, seen lists and precomputed top-K lists."""
        d, n, rank = art.data, art.n_keys, art.rank
        if sp.issparse(d.user_factors):       # each user's (column, value) pairs
            U = d.user_factors
            u_bytes, ptr = pack_pairs(U.indices, U.data), U.indptr * PAIR_DTYPE.itemsize
            starts, stops = ptr[:-1].tolist(), ptr[1:].tolist()
        else:
            u_bytes = pack_f32(d.user_factors)
            starts, stops = (range(0, n * rank * 4, rank * 4),
                             range(rank * 4, (n + 1) * rank * 4, rank * 4))
        prefixes = vk.bucket_prefixes
        bucket_list = buckets.tolist()
        w.mset_buckets([prefixes[b] + "u:" + k for b, k in zip(bucket_list, key_strs)],
                       _slices(u_bytes, starts, stops), buckets)
        if d.seen_indptr is not None:
            has = np.flatnonzero(np.diff(d.seen_indptr) > 0)
            seen_bytes = pack_i32(d.seen_indices)
            ptr = d.seen_indptr * 4
            w.mset_buckets([prefixes[bucket_list[u]] + "seen:" + key_strs[u]
                            for u in has.tolist()],
                           _slices(seen_bytes, ptr[has].tolist(), ptr[has + 1].tolist()),
                           buckets[has])
        blocks = user_topk_blocks(d.user_factors, d.item_factors, top_k,
                                  item_bias=d.item_bias, seen_indptr=d.seen_indptr,
                                  seen_indices=d.seen_indices)
        mask = d.precompute
        topk_prefixes = [p + "topk:" for p in prefixes]
        waited = 0.0
        while True:
            t0 = time.perf_counter()
            blk = next(blocks, None)
            waited += time.perf_counter() - t0
            if blk is None:
                break
            b, k = blk.indices.shape
            rec = np.empty((b, k), dtype=PAIR_DTYPE)
            rec["index"] = blk.indices
            rec["score"] = blk.scores
            rows = range(blk.start, blk.start + b)
            starts = range(0, b * k * 8, k * 8)
            stops = [s + c * 8 for s, c in zip(starts, blk.counts.tolist())]
            values = _slices(rec.tobytes(), starts, stops)
            keys = [topk_prefixes[bucket_list[r]] + key_strs[r] for r in rows]
            block_buckets = buckets[blk.start:blk.start + b]
            if mask is not None:
                sel = mask[blk.start:blk.start + b]
                keys = [x for x, s in zip(keys, sel.tolist()) if s]
                values = [x for x, s in zip(values, sel.tolist()) if s]
                block_buckets = block_buckets[sel]
            w.mset_buckets(keys, values, block_buckets)
            if progress is not None:
                progress.update(b)
        return waited


class QueryDocs(ArtifactKind):
    """``build(query_ids=, doc_ids=, indptr=, docs=, scores=, fallback_scores=None)``: per
    query a list of candidate docs (indices into ``doc_ids``) with scores, in CSR form (kernel
    RankSVM); each query's list is ranked by score when published."""

    name = "query_docs"
    payload = QueryDocsData
    needs = ("key_ids", "list_indptr", "list_items", "list_scores")
    per_key = True

    def build(self, *, query_ids, doc_ids, indptr, docs, scores, fallback_scores=None):
        return doc_ids, QueryDocsData(key_ids=query_ids, list_indptr=indptr, list_items=docs,
                                      list_scores=scores, fallback_scores=fallback_scores)

    def validate(self, art) -> None:
        super().validate(art)
        d = art.data
        d.list_indptr, d.list_items = csr("query lists", d.list_indptr, d.list_items,
                                          art.n_keys, art.n_items)
        d.list_scores = floats("list_scores", d.list_scores, d.list_items.shape)

    def counts(self, art) -> dict:
        return {**super().counts(art),
                "n_lists": int((np.diff(art.data.list_indptr) > 0).sum())}

    def write_lists(self, w, vk, art, key_strs, buckets, top_k, progress) -> float:
        """Each query's docs, ranked by score (then doc index), the first ``top_k``."""
        indptr, docs, scores = art.data.list_indptr, art.data.list_items, art.data.list_scores
        rows = np.repeat(np.arange(art.n_keys), np.diff(indptr))
        order = np.lexsort((docs, -scores, rows))  # per query: score desc, then doc index
        rank_in_row = np.arange(len(order)) - indptr[rows[order]]
        keep = order[rank_in_row < top_k]
        packed = pack_pairs(docs[keep], scores[keep])
        counts = np.minimum(np.diff(indptr), top_k)
        ends = np.cumsum(counts) * PAIR_DTYPE.itemsize
        starts = ends - counts * PAIR_DTYPE.itemsize
        has = np.flatnonzero(counts > 0)
        prefixes = vk.bucket_prefixes
        w.mset_buckets([prefixes[b] + "topk:" + key_strs[q]
                        for q, b in zip(has.tolist(), buckets[has].tolist())],
                       _slices(packed, starts[has].tolist(), ends[has].tolist()), buckets[has])
        if progress is not None:
            progress.update(art.n_keys)
        return 0.0


KINDS: dict[str, ArtifactKind] = {}


def register(entry: ArtifactKind) -> ArtifactKind:
    """Add a serving shape to :data:`KINDS`; its name must be new."""
    return add_entry(KINDS, entry.name, entry, "artifact kind")


for _kind in (UserItem(), GlobalList(), QueryDocs(), PredictedRatings()):
    register(_kind)


def payload_fields() -> frozenset:
    """Every field name of a registered kind's payload."""
    return frozenset(f.name for k in KINDS.values() for f in fields(k.payload))


def kind_of(name: str) -> ArtifactKind:
    """The registered kind ``name``; ``ValueError`` naming the known ones otherwise."""
    try:
        return KINDS[name]
    except (KeyError, TypeError):
        raise ValueError(f"kind {name!r} is not one of {tuple(KINDS)}") from None


# ---------------------------------------------------------------------- shared checks

def floats(name: str, values, shape: tuple) -> np.ndarray:
    """``values`` as C-contiguous float32 of ``shape``, all finite."""
    arr = np.ascontiguousarray(values, dtype=np.float32)
    if arr.shape != shape:
        raise ValueError(f"{name} has shape {arr.shape}, expected {shape}")
    if not np.isfinite(arr).all():
        raise ValueError(f"{name} has {int((~np.isfinite(arr)).sum())} non-finite values")
    return arr


def sparse_floats(name: str, values, shape: tuple):
    """``values`` as a float32 CSR matrix of ``shape`` (sorted indices), all finite."""
    arr = sp.csr_matrix(values, dtype=np.float32)
    if arr.shape != shape:
        raise ValueError(f"{name} has shape {arr.shape}, expected {shape}")
    if not np.isfinite(arr.data).all():
        raise ValueError(f"{name} has {int((~np.isfinite(arr.data)).sum())} non-finite values")
    arr.sort_indices()
    return arr


def csr(name: str, indptr, indices, n_rows: int, n_cols: int) -> tuple[np.ndarray, np.ndarray]:
    """A checked CSR structure: int64 ``indptr`` of ``n_rows + 1``, int32 indices < n_cols."""
    indptr = np.asarray(indptr, dtype=np.int64)
    indices = np.asarray(indices, dtype=np.int32)
    if indptr.shape != (n_rows + 1,) or indptr[0] != 0 or indptr[-1] != len(indices):
        raise ValueError(f"{name}: indptr has shape {indptr.shape} and ends at "
                         f"{indptr[-1] if len(indptr) else None}, expected shape ({n_rows + 1},) "
                         f"from 0 to {len(indices)} (the number of indices)")
    if (np.diff(indptr) < 0).any():
        raise ValueError(f"{name}: indptr is not non-decreasing")
    if len(indices) and (indices.min() < 0 or indices.max() >= n_cols):
        raise ValueError(f"{name}: index {int(indices.max())} or {int(indices.min())} is "
                         f"outside 0..{n_cols - 1}")
    return indptr, indices


def _slices(buf: bytes, starts, stops) -> list:
    mv = memoryview(buf)
    return [mv[a:b] for a, b in zip(starts, stops)]
