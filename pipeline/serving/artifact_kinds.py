"""The serving shapes a published model takes, one :class:`ArtifactKind` each, registered by
name in :data:`KINDS`: what a :class:`~pipeline.serving.artifact.ModelArtifact` of the kind
needs and how it is checked, how many keys it writes, its list for everyone, how its per-key
lists are written, and whether lookups read it per key. A family with a new serving shape adds
one class here and registers it (and its row in ``REDIS_LAYOUT.md``); the artifact, the
publisher and the lookup client ask the registry.

=====================  ==============================================================
``user_item``          user factors U, item factors V, optional item bias b and seen items
                       per user (CSR): per-user top-K of ``U @ V.T + b``
``global_list``        one score per candidate item: one ranked list
``query_docs``         per query a list of (doc, score), ranked per query
``predicted_ratings``  one predicted rating per item: one ranked list
=====================  ==============================================================

Examples
--------
>>> kind_of("user_item").per_key, kind_of("global_list").needs
(True, ('item_scores',))
"""

from __future__ import annotations

import time

import numpy as np

from pipeline.serving.layout import PAIR_DTYPE, pack_f32, pack_i32, pack_pairs
from solvers.topk import user_topk_blocks


class ArtifactKind:
    """One serving shape (see the module docstring); the defaults fit a single global list."""

    name = ""
    needs: tuple[str, ...] = ()      # the artifact fields the kind cannot do without
    per_key = False                  # lookups read a list per user or query key

    def validate(self, art) -> None:
        """Check and normalise the kind's own fields in place (``ValueError`` naming them)."""

    def counts(self, art) -> dict:
        """The meta hash's ``n_lists``, ``n_factor_keys``, ``n_seen_keys``."""
        return {"n_lists": 0, "n_factor_keys": 0, "n_seen_keys": 0}

    def global_scores(self, art) -> tuple[np.ndarray | None, str]:
        """Per-item scores of the list served to everyone and its role (``"model"``: the
        model's own list, ``"fallback"``: for unknown keys, ``"none"``)."""
        if art.fallback_scores is not None:
            return art.fallback_scores, "fallback"
        return None, "none"

    def write_lists(self, w, vk, art, key_strs: list[str], buckets: np.ndarray, top_k: int,
                    progress) -> float:
        """Write the per-key lists through the shard writer ``w``; returns the seconds spent
        waiting for their top-K computation."""
        return 0.0


class GlobalList(ArtifactKind):
    name = "global_list"
    needs = ("item_scores",)

    def global_scores(self, art):
        return art.item_scores, "model"


class PredictedRatings(ArtifactKind):
    name = "predicted_ratings"
    needs = ("item_scores",)

    def global_scores(self, art):
        # ranked by the continuous ranking score when there is one, not by the rating
        return (art.item_scores if art.fallback_scores is None else art.fallback_scores,
                "model")


class UserItem(ArtifactKind):
    name = "user_item"
    needs = ("key_ids", "user_factors", "item_factors")
    per_key = True

    def validate(self, art) -> None:
        n_keys, n_items = art.n_keys, art.n_items
        fac = np.asarray(art.user_factors)
        rank = fac.shape[1] if fac.ndim == 2 else -1
        art.user_factors = floats("user_factors", fac, (n_keys, rank))
        art.item_factors = floats("item_factors", art.item_factors, (n_items, rank))
        if art.item_bias is not None:
            art.item_bias = floats("item_bias", art.item_bias, (n_items,))
        if (art.seen_indptr is None) != (art.seen_indices is None):
            raise ValueError("seen needs both indptr and indices")
        if art.seen_indptr is not None:
            art.seen_indptr, art.seen_indices = csr("seen", art.seen_indptr, art.seen_indices,
                                                    n_keys, n_items)
        if art.precompute is not None:
            art.precompute = np.asarray(art.precompute, dtype=bool)
            if art.precompute.shape != (n_keys,):
                raise ValueError(f"precompute has shape {art.precompute.shape}, expected "
                                 f"({n_keys},) (one flag per user)")

    def counts(self, art) -> dict:
        return {"n_lists": art.n_keys if art.precompute is None else int(art.precompute.sum()),
                "n_factor_keys": art.n_keys,
                "n_seen_keys": 0 if art.seen_indptr is None
                else int((np.diff(art.seen_indptr) > 0).sum())}

    def global_scores(self, art):
        if art.fallback_scores is not None:
            return art.fallback_scores, "fallback"
        scores = art.item_factors @ art.user_factors.mean(axis=0, dtype=np.float64)
        if art.item_bias is not None:      # the mean user's list
            scores = scores + art.item_bias
        return scores.astype(np.float32), "fallback"

    def write_lists(self, w, vk, art, key_strs, buckets, top_k, progress) -> float:
        """Per-user factors, seen lists and precomputed top-K lists."""
        n = art.n_keys
        rank = art.rank
        u_bytes = pack_f32(art.user_factors)
        prefixes = vk.bucket_prefixes
        bucket_list = buckets.tolist()
        w.mset_buckets([prefixes[b] + "u:" + k for b, k in zip(bucket_list, key_strs)],
                       _slices(u_bytes, range(0, n * rank * 4, rank * 4),
                               range(rank * 4, (n + 1) * rank * 4, rank * 4)), buckets)
        if art.seen_indptr is not None:
            has = np.flatnonzero(np.diff(art.seen_indptr) > 0)
            seen_bytes = pack_i32(art.seen_indices)
            ptr = art.seen_indptr * 4
            w.mset_buckets([prefixes[bucket_list[u]] + "seen:" + key_strs[u]
                            for u in has.tolist()],
                           _slices(seen_bytes, ptr[has].tolist(), ptr[has + 1].tolist()),
                           buckets[has])
        blocks = user_topk_blocks(art.user_factors, art.item_factors, top_k,
                                  item_bias=art.item_bias, seen_indptr=art.seen_indptr,
                                  seen_indices=art.seen_indices)
        mask = art.precompute
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
    name = "query_docs"
    needs = ("key_ids", "list_indptr", "list_items", "list_scores")
    per_key = True

    def validate(self, art) -> None:
        art.list_indptr, art.list_items = csr("query lists", art.list_indptr, art.list_items,
                                              art.n_keys, art.n_items)
        art.list_scores = floats("list_scores", art.list_scores, art.list_items.shape)

    def counts(self, art) -> dict:
        return {**super().counts(art), "n_lists": int((np.diff(art.list_indptr) > 0).sum())}

    def write_lists(self, w, vk, art, key_strs, buckets, top_k, progress) -> float:
        """Each query's docs, ranked by score (then doc index), the first ``top_k``."""
        indptr, docs, scores = art.list_indptr, art.list_items, art.list_scores
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
    if entry.name in KINDS:
        raise ValueError(f"artifact kind {entry.name!r} is registered already")
    KINDS[entry.name] = entry
    return entry


for _kind in (UserItem(), GlobalList(), QueryDocs(), PredictedRatings()):
    register(_kind)


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
