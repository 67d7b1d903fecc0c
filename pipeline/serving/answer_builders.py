"""Answers from what a lookup read: a version's in-process state and the bytes Redis returned
in, a :class:`~pipeline.serving.answers.Recommendation` or
:class:`~pipeline.serving.answers.Prediction` out. No I/O: :class:`~pipeline.serving.lookup.TopK`
resolves the version and fetches the values (and, once per version, the item factors or global
scores a builder ranks by), then hands them here.

Every stored value is checked against the version it was read for: a list of ``n`` pairs is
``8 n`` bytes with ``n <= top_k`` and every index below ``n_items``; a user factor holds
``rank`` floats; a seen list holds item indices of the version. A value that does not fit is a
:class:`~pipeline.serving.layout.LayoutError`, never a wrong answer.

Examples
--------
>>> from pipeline.serving.layout import pack_pairs
>>> class Version:   # what pairs_of reads of a version
...     top_k, n_items, item_ids = 3, 3, ["a", "b", "c"]
>>> pairs_of(Version(), pack_pairs([2, 0], [0.5, 0.25]), k=1, key="k")
[('c', 0.5)]
"""

from __future__ import annotations

import numpy as np

from pipeline.serving.answers import Prediction, Recommendation
from pipeline.serving.item_filter import ItemFilter
from pipeline.serving.layout import LayoutError, pair_struct, unpack_i32
from pipeline.serving.sparse_factors import is_sparse, unpack_factor
from pipeline.serving.version_cache import VersionState
from solvers.topk import topk_of_scores

FRESH = "fresh"   # the source of an answer from keys the refresher wrote (any served_as)

_STRUCTS = [pair_struct(n) for n in range(257)]


MAX_K = 1000   # the bound on k: the HTTP API's, `rankstream recommend`'s and the client's


def check_k(k: int) -> None:
    """A lookup's ``k``: 0..MAX_K, the bound the API and the CLI keep (ValueError naming it:
    a ``k`` of 100,000 asked for every item of a catalogue in one answer)."""
    if not 0 <= k <= MAX_K:
        raise ValueError(f"k is {k}, expected 0..{MAX_K} (the bound of the HTTP API and "
                         "`rankstream recommend`)")


def fallback_source(st: VersionState) -> str:
    """The source of a per-key model's list for everyone: ``fallback``, or ``missing`` when
    the version has none."""
    return "fallback" if st.global_items is not None else "missing"


def pairs_of(st: VersionState, value: bytes, k: int, key: str) -> list:
    """Stored (int32 index, float32 score) pairs -> [(item id, score)], the first ``k``."""
    n = len(value) >> 3
    if len(value) & 7 or n > st.top_k:
        raise LayoutError(f"{key} holds {len(value)} bytes, not up to {st.top_k} "
                          "(int32 index, float32 score) pairs")
    if n > k:
        n = k
    flat = (_STRUCTS[n] if n <= 256 else pair_struct(n)).unpack_from(value)
    ids = st.item_ids
    try:
        return list(zip([ids[i] for i in flat[0::2]], flat[1::2]))
    except IndexError:
        raise LayoutError(f"{key} lists an item index outside the version's {st.n_items} "
                          "items") from None


def precomputed(st: VersionState, user, value: bytes, k: int, key: str,
                fresh: bytes | None = None) -> Recommendation:
    """The first ``k`` of ``user``'s stored list; ``fresh``: the user's ``fresh`` marker read
    with it (the refresher wrote the list: ``source`` ``fresh``)."""
    return Recommendation(st.model, user, pairs_of(st, value, k, key), st.version,
                          st.sources["precomputed"] if fresh is None else FRESH)


def global_needs_scores(st: VersionState, k: int, filt: ItemFilter | None) -> bool:
    """Whether :func:`ranked_global` needs the per-item global scores: the stored list (what
    ``filt`` keeps of it) holds fewer than ``k`` items, and it was cut at ``top_k`` (items past
    it exist)."""
    if st.global_items is None or len(st.global_items) < st.top_k:
        return False
    return len(st.global_items if filt is None else filt.keep(st.global_items)) < k


def ranked_global(st: VersionState, k: int, filt: ItemFilter | None,
                  scores: np.ndarray | None = None) -> list:
    """The first ``k`` of the global list (a global-list model's, or the fallback) that
    ``filt`` lets through; when :func:`global_needs_scores`, every eligible item ranked by the
    per-item ``scores`` instead (without them, the filtered stored list is all there is)."""
    if st.global_items is None:
        return []
    listed = st.global_items if filt is None else filt.keep(st.global_items)
    if len(listed) >= k or len(st.global_items) < st.top_k or scores is None:
        return listed[:k]
    idx, sc = topk_of_scores(scores if filt is None else filt.mask(scores), k)
    ids = st.item_ids
    return [(ids[i], s) for i, s in zip(idx.tolist(), sc.tolist())]


def global_answer(st: VersionState, user, items: list) -> Recommendation:
    """A global-list model's answer (``missing`` when the version has no list)."""
    if st.global_items is None:
        return Recommendation(st.model, user, [], st.version, "missing")
    return Recommendation(st.model, user, items, st.version, st.sources["global"])


def everyone_answer(st: VersionState, user, items: list) -> Recommendation:
    """A per-key model's list for everyone (the fallback) as ``user``'s answer."""
    return Recommendation(st.model, user, items, st.version, fallback_source(st))


def listed_enough(st: VersionState, user, value: bytes | None, k: int, key: str,
                  filt: ItemFilter | None, fresh: bytes | None = None) -> Recommendation | None:
    """``user``'s answer from their stored list when the list alone decides it, else None
    (no list; or ``k`` past ``top_k``, or a filter that leaves fewer than ``k``, for a version
    that can score the user's factor). A filtered list short of ``k`` still decides when it
    was not cut at ``top_k``: it then holds every item the user has not met. ``fresh``: the
    user's ``fresh`` marker, read with the list."""
    if value is None:
        return None
    if filt is None:
        return (precomputed(st, user, value, k, key, fresh) if k <= st.top_k or not st.rank
                else None)
    listed = pairs_of(st, value, st.top_k, key)
    kept = filt.keep(listed)
    if len(kept) >= k or len(listed) < st.top_k or not st.rank:
        return Recommendation(st.model, user, kept[:k], st.version,
                              st.sources["precomputed"] if fresh is None else FRESH)
    return None


def scored_items(st: VersionState, factors, u_raw: bytes, seen_raw: bytes | None, k: int,
                 key: str, seen_key: str, filt: ItemFilter | None) -> list:
    """The top ``k`` of ``s = V u + b`` over the version's items (``factors``: ``(V, b)``),
    the user's seen items and what ``filt`` takes out left aside."""
    V, b = factors
    u = unpack_factor(u_raw, key, st.rank, sparse=is_sparse(st.meta))
    scores = V @ u if b is None else V @ u + b
    if filt is not None:
        scores = filt.mask(scores)
    seen = None
    if seen_raw is not None:
        seen = unpack_i32(seen_raw, seen_key)
        if len(seen) and (seen.min() < 0 or seen.max() >= st.n_items):
            raise LayoutError(f"{seen_key} lists an item index outside the version's "
                              f"{st.n_items} items")
    idx, sc = topk_of_scores(scores, k, exclude=seen)
    ids = st.item_ids
    return [(ids[i], s) for i, s in zip(idx.tolist(), sc.astype(np.float32).tolist())]


def second_answer(st: VersionState, user, name: str, bucket: int, listed: bytes | None,
                  exists: bool, u_raw: bytes | None, seen_raw: bytes | None, k: int,
                  filt: ItemFilter | None, factors, fallback: list | None,
                  fresh: bytes | None = None) -> Recommendation:
    """``user``'s answer after the second round trip: scored from their factor when they have
    one, else their stored list (filtered), else the list for everyone (``fallback``).
    ``exists``: whether the list key exists although ``GET`` found no string there;
    ``fresh``: the ``fresh`` marker read with what answers (the factor, or else the list).
    A list that appeared between the round trips with a factor and a ``fresh`` marker beside
    it is a user the refresher wrote meanwhile (one atomic write): their factor answers."""
    if listed is None and exists and (u_raw is None or fresh is None):
        raise LayoutError(f"{st.topk_prefixes[bucket] + name} exists but is not a string (a "
                          "foreign key under the namespace?)")
    if u_raw is not None:
        items = scored_items(st, factors, u_raw, seen_raw, k, st.user_prefixes[bucket] + name,
                             st.seen_prefixes[bucket] + name, filt)
        return Recommendation(st.model, user, items, st.version,
                              st.sources["on_demand"] if fresh is None else FRESH)
    if listed is not None:
        items = pairs_of(st, listed, k, name)
        return Recommendation(st.model, user, items if filt is None else filt.keep(items)[:k],
                              st.version, st.sources["precomputed"] if fresh is None else FRESH)
    return everyone_answer(st, user, fallback)


def filtered_last_known(answers: list, k: int, exclude, allow) -> list:
    """Last-known ``answers`` (asked for more than ``k``) with ``exclude`` / ``allow`` applied
    by item id (the version is not at hand to resolve them), cut to ``k``."""
    drop, only = set(exclude or ()), None if allow is None else set(allow)
    for rec in answers:
        rec.items = [p for p in rec.items if p[0] not in drop and str(p[0]) not in drop
                     and (only is None or p[0] in only or str(p[0]) in only)][:k]
    return answers


def checked_candidates(candidates) -> list:
    """``candidates`` as a list of ``(id, x)`` pairs; a ValueError names the first that is
    not one."""
    candidates = list(candidates)
    for n, c in enumerate(candidates):
        if not isinstance(c, (tuple, list)) or len(c) != 2:
            raise ValueError(f"candidates[{n}] is {c!r:.60}, expected an (id, features) pair")
    return candidates


def ranked_candidates(st: VersionState, query, candidates: list, k: int,
                      stale: bool) -> Recommendation:
    """The top ``k`` of ``candidates`` by the version's scorer (ties keep the given order)."""
    scores = st.scorer.score(st.scorer.rows([x for _, x in candidates]))
    best = np.argsort(-scores, kind="stable")[:k]
    return Recommendation(st.model, query, [(candidates[i][0], float(scores[i])) for i in best],
                          st.version, st.sources["scored"], stale)


def rating(st: VersionState, features, text, stale: bool) -> Prediction:
    """The version's ordinal rating, and ranking score, of one item's ``features`` / ``text``."""
    X = st.scorer.rows([{"features": features, "text": text}])
    return Prediction(st.model, int(st.scorer.predict_rating(X)[0]),
                      float(st.scorer.score(X)[0]), st.version, stale)
