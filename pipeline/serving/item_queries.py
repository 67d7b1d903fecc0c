"""Answers computed from a version's item factors at request time: items similar to an item,
and recommendations for a user the version does not know, folded in from their items.

Both rank with the one top-K of the project (:func:`solvers.topk.topk_of_scores`) and keep
what they derive per version (unit-length factors, ``VᵀV``, the head of each asked item's
similar list) in the version's state: versions are immutable, so it is computed once per
version and process.

A fold-in is named by the trainer that publishes the version: its artifact's ``fold_in`` spec
holds a ``method`` and that method's settings. Each method is a :class:`FoldIn` registered by
name in :data:`FOLD_INS` (the two problems of :mod:`solvers.fold_in` are registered below);
a ``module:Class`` method (a plugin's own :class:`FoldIn` subclass) is imported and registered
on first use, so the serving process needs no registration step and never asks the training
registry.
"""

from __future__ import annotations

import numpy as np
import scipy.sparse as sp

from pipeline.serving.answers import Recommendation
from pipeline.serving.item_filter import ItemFilter
from pipeline.serving.plugins import add_entry, registered
from pipeline.serving.sparse_factors import scores_of, unit_rows
from pipeline.serving.version_cache import VersionState
from solvers.fold_in import (
    implicit_pairs_many,
    least_squares_fold_in_many,
    pairwise_fold_in_many,
    sorted_unique,
)
from solvers.topk import topk_of_scores

SIMILAR_KEPT = 100             # the head of an item's similar list kept per version and process
SIMILAR_ITEMS_KEPT = 10_000    # items whose heads are kept (the first kept goes first): 8 MB
MAX_FOLD_IN_ITEMS = 500        # items (or comparisons) one fold-in takes
FOLD_IN_EPOCHS = 200           # dual coordinate descent sweeps: bounds the time of one
FOLD_IN_GAP = 1e-6             # relative duality gap a fold-in stops at


class UnknownItemError(LookupError):
    """The version has no such item."""


def _answer(st: VersionState, asked, scores: np.ndarray, k: int, exclude, filt: ItemFilter,
            source: str) -> Recommendation:
    idx, sc = topk_of_scores(filt.mask(scores), k, exclude=exclude)
    ids = st.item_ids
    items = [(ids[i], s) for i, s in zip(idx.tolist(), sc.astype(np.float32).tolist())]
    return Recommendation(st.model, asked, items, st.version, st.sources[source])


def _derived(st: VersionState, name: str, make):
    value = st.derived.get(name)
    if value is None:
        value = st.derived[name] = make()
    return value


def similar(st: VersionState, factors, item, k: int, filt: ItemFilter) -> Recommendation:
    """The ``k`` items of highest cosine similarity to ``item``'s factor (itself left out)."""
    if not st.rank:
        raise ValueError(f"model {st.model!r} version {st.version} ({st.kind}) has no item "
                         "factors: similar items need a factor model")
    i = st.index_of(item)
    if i is None:
        raise UnknownItemError(f"item {item!r:.60} is not in model {st.model!r} version "
                               f"{st.version}")
    V = factors[0]
    U = _derived(st, "unit", lambda: unit_rows(V))
    # An item's list is a fixed function of the immutable version, and item pages ask for the
    # same items again and again: its head is computed once (per version and process) and a
    # lookup filters that. A filtered head is the head of the filtered list (filtering keeps
    # the order, and every item past the head ranks below it), so it answers whenever it still
    # holds k items, or holds the whole catalogue; else the full list is ranked as before.
    heads = _derived(st, "similar", dict)
    head = heads.get(i)
    if head is None:
        if len(heads) >= SIMILAR_ITEMS_KEPT:
            try:
                del heads[next(iter(heads))]
            except (KeyError, RuntimeError):   # another thread changed the heads meanwhile
                pass
        top, scores = topk_of_scores(scores_of(U, U[i]), SIMILAR_KEPT, exclude=[i])
        head = heads[i] = top.astype(np.int32), scores
    idx, sc = head
    if len(filt.excluded) or filt.allowed is not None:
        keep = ~np.isin(idx, filt.excluded)
        if filt.allowed is not None:
            keep &= np.isin(idx, filt.allowed)
        idx, sc = idx[keep], sc[keep]
    if len(idx) >= k or len(head[0]) < SIMILAR_KEPT:
        ids = st.item_ids
        items = [(ids[j], s) for j, s in zip(idx[:k].tolist(), sc[:k].tolist())]
        return Recommendation(st.model, item, items, st.version, st.sources["on_demand"])
    return _answer(st, item, scores_of(U, U[i]), k, [i], filt, "on_demand")


def known_items(st: VersionState, items) -> np.ndarray:
    """Sorted indices of the ``items`` the version knows (unknown ones are skipped)."""
    items = list(items or ())
    if len(items) > MAX_FOLD_IN_ITEMS:
        raise ValueError(f"{len(items)} items, at most {MAX_FOLD_IN_ITEMS} are taken")
    found = {st.index_of(x) for x in items} - {None}
    return np.fromiter(sorted(found), np.int64, len(found))


def known_pairs(st: VersionState, comparisons) -> np.ndarray:
    """(winner, loser) index rows of the ``comparisons`` whose items the version knows."""
    rows = []
    for n, c in enumerate(comparisons or ()):
        if not isinstance(c, (list, tuple)) or len(c) != 2:
            raise ValueError(f"comparisons[{n}] is {c!r:.60}, expected [winner, loser]")
        w, lo = st.index_of(c[0]), st.index_of(c[1])
        if w is not None and lo is not None and w != lo:
            rows.append((w, lo))
    if len(rows) > MAX_FOLD_IN_ITEMS:
        raise ValueError(f"{len(rows)} comparisons, at most {MAX_FOLD_IN_ITEMS} are taken")
    return np.array(rows, np.int64).reshape(-1, 2)


class FoldIn:
    """One way to give a user the version has not met a factor from the items they met
    (``met``, indices) and their comparisons (``pairs``, (winner, loser) index rows), with
    the item factors ``V`` (and bias ``b``, or None) fixed; ``keys`` are the spec's settings
    besides ``method``."""

    method = ""
    keys: tuple[str, ...] = ()

    def check(self, spec: dict) -> None:
        """``ValueError`` naming what the spec lacks."""
        missing = [k for k in self.keys if k not in spec]
        if missing:
            raise ValueError(f"fold_in {spec!r:.80} lacks {missing} (method {self.method!r} "
                             f"takes {list(self.keys)})")

    def user_factor(self, st: VersionState, V, b, met, pairs, spec: dict) -> np.ndarray:
        raise NotImplementedError

    def user_factors(self, st: VersionState, V, b, mets: list, pairs: list, spec: dict,
                     starts=None, seen=None) -> np.ndarray:
        """:meth:`user_factor` of several users (``mets[n]``, ``pairs[n]``), one row each;
        a method with a batched solve overrides it. ``starts``: each user's last factor (a
        row each, or None), where an iterative method may start: the answer is the same
        optimum, reached in fewer steps. ``seen``: each user's met items where they are more
        than ``mets`` (a refreshed user's low ratings: met, not winners), or None."""
        rows = [np.asarray(self.user_factor(st, V, b, m, p, spec), np.float64)
                for m, p in zip(mets, pairs)]
        return np.stack(rows) if rows else np.zeros((0, V.shape[1]))


class PairwiseFoldIn(FoldIn):
    """AltSVM's own problem with V fixed, on the user's comparisons and implicit ones made
    from their items: ``per_item`` each, or, when the spec's ``per_user`` is above 0 (training's
    ``implicit_per_user``: comparisons per user in all), ``ceil(per_user / items)`` each, at
    most the spec's ``max_per_positive`` (training's ``implicit_max_per_positive``) when set.

    The spec may also say how training derived a user's inputs from their events, for whoever
    derives them (the refresher): ``relevance`` and ``min_rating`` (the resolved relevance
    threshold, and the rating an item needs to win a comparison), ``comparisons`` (training's
    mode) and ``rating_range``; the fold-in itself takes the items and comparisons as given."""

    method = "pairwise"
    keys = ("reg", "loss")

    @staticmethod
    def per_item(spec: dict, n_met: int) -> int:
        """Implicit comparisons per met item."""
        per_user = int(spec.get("per_user") or 0)
        if per_user > 0:
            per = -(-per_user // max(n_met, 1))
            return min(per, int(spec.get("max_per_positive") or per))
        return int(spec.get("per_item", 10))

    @classmethod
    def drawn(cls, st, mets: list, spec: dict, seen=None) -> list:
        """Each user's implicit comparisons, as training makes theirs: ``per_item`` for each
        winning item against items not ``seen``, drawn uniformly or (the spec's ``sampling``
        ``popularity``) by the counts the version publishes (``st.loser_cum``, loaded with
        its factors; uniformly where a version has none), at most ``per_user`` and
        ``max_pairs_per_user`` in all (the draws of smallest hash)."""
        caps = [int(c) for c in (spec.get("per_user"), spec.get("max_pairs_per_user")) if c]
        cum = getattr(st, "loser_cum", None) if spec.get("sampling") == "popularity" else None
        return implicit_pairs_many(
            mets, st.n_items, [cls.per_item(spec, len(sorted_unique(m))) for m in mets],
            seen=seen, caps=[min(caps) if caps else None] * len(mets), cum=cum)

    def user_factor(self, st, V, b, met, pairs, spec, start=None):
        # the jitted many-user kernel, for one: 1.5x the numpy reference's speed
        return self.user_factors(st, V, b, [met], [pairs], spec, starts=[start])[0]

    def user_factors(self, st, V, b, mets, pairs, spec, starts=None, seen=None):
        V64 = _derived(st, "V64", lambda: V.astype(np.float64))
        b64 = None if b is None else _derived(st, "b64", lambda: b.astype(np.float64))
        drawn = self.drawn(st, mets, spec, seen)
        rows = [np.concatenate([p, d]) if len(p) else d for p, d in zip(pairs, drawn)]
        return pairwise_fold_in_many(V64, b64, rows, reg=float(spec["reg"]), loss=spec["loss"],
                                     starts=starts, max_epochs=FOLD_IN_EPOCHS,
                                     gap_tol=FOLD_IN_GAP)


class LeastSquaresFoldIn(FoldIn):
    """ALS's confidence-weighted least squares with V fixed (met and winning items count)."""

    method = "least_squares"
    keys = ("reg", "alpha")

    def user_factor(self, st, V, b, met, pairs, spec):
        return self.user_factors(st, V, b, [met], [pairs], spec)[0]

    def user_factors(self, st, V, b, mets, pairs, spec, starts=None, seen=None):
        V64 = _derived(st, "V64", lambda: V.astype(np.float64))
        gram = _derived(st, "gram", lambda: V64.T @ V64)
        items = [sorted_unique(np.concatenate([m, p[:, 0]])) for m, p in zip(mets, pairs)]
        return least_squares_fold_in_many(V64, items, reg=float(spec["reg"]),
                                          alpha=float(spec["alpha"]), gram=gram)


class _Part:
    """A blend part's view of the version: the version itself, but with its own ``derived``
    (what a part's method keeps is of the part's columns, not of the whole factors)."""

    def __init__(self, st: VersionState, n: int):
        self.st = st
        self.derived = st.derived.setdefault(f"blend:{n}", {})

    def __getattr__(self, name):
        return getattr(self.st, name)


class BlendFoldIn(FoldIn):
    """A blend's user: each part's own fold-in against the part's columns of V, scaled.

    Spec ``{"method": "blend", "parts": [{...part 1's spec, "columns": [0, r1], "scale": a},
    {...part 2's, "columns": [r1, r1 + r2], "scale": b}, ...]}``: published factors
    ``[a U₁, b U₂]`` against ``[V₁, V₂]`` with item bias ``a b₁`` (``trainers/als.py``
    ``blend``). A new user's factor is ``[a u₁, b u₂]``, ``u₁`` part 1's fold-in against
    ``V[:, 0:r1]`` with bias ``bias / a`` (the first part's own; none when ``a`` is 0), ``u₂``
    part 2's against ``V[:, r1:r1 + r2]`` without one; the parts' columns tile the factors."""

    method = "blend"
    keys = ("parts",)

    def check(self, spec: dict) -> None:
        super().check(spec)
        parts = spec["parts"]
        if not isinstance(parts, list) or not parts:
            raise ValueError(f"blend fold_in parts is {parts!r:.60}, expected a list of specs")
        end = 0
        for n, part in enumerate(parts):
            if not isinstance(part, dict) or part.get("method") == self.method:
                raise ValueError(f"blend fold_in part {n} is {part!r:.60}, expected the spec "
                                 "of another method")
            cols, scale = part.get("columns"), part.get("scale")
            if (not isinstance(cols, list) or len(cols) != 2 or cols[0] != end
                    or not cols[1] > cols[0] or not isinstance(scale, (int, float))):
                raise ValueError(f"blend fold_in part {n} has columns {cols!r} and scale "
                                 f"{scale!r}, expected columns [{end}, end > {end}] and a "
                                 "number")
            end = cols[1]
            fold_in_method(part["method"]).check(part)

    def user_factor(self, st, V, b, met, pairs, spec):
        return self.user_factors(st, V, b, [met], [pairs], spec)[0]

    def user_factors(self, st, V, b, mets, pairs, spec, starts=None, seen=None):
        parts = spec["parts"]
        if parts[-1]["columns"][1] != V.shape[1]:
            raise ValueError(f"blend fold_in parts cover {parts[-1]['columns'][1]} columns, "
                             f"the version has rank {V.shape[1]}")
        out = []
        for n, part in enumerate(parts):
            lo, hi = part["columns"]
            scale = float(part["scale"])
            view = _Part(st, n)
            Vp = _derived(view, "V", lambda lo=lo, hi=hi, m=part["method"]: part_columns(
                V, lo, hi, sparse_ok=m == ItemItemFoldIn.method))
            bp = None
            if n == 0 and b is not None and scale != 0.0:
                bp = _derived(view, "b", lambda s=scale: (b / s).astype(b.dtype))
            begin = None   # the part's own last factor: its columns of the blend's, unscaled
            if starts is not None and scale != 0.0:
                begin = [None if x is None else np.asarray(x, np.float64)[lo:hi] / scale
                         for x in starts]
            U = fold_in_method(part["method"]).user_factors(view, Vp, bp, mets, pairs, part,
                                                            starts=begin, seen=seen)
            out.append(scale * np.asarray(U, np.float64).reshape(len(mets), hi - lo))
        return np.concatenate(out, axis=1)


def part_columns(V, lo: int, hi: int, *, sparse_ok: bool):
    """Columns ``lo:hi`` of the item factors: dense, unless they are sparse and the part's
    method takes them so (an item-kNN's neighbour rows, as wide as the catalogue)."""
    cols = V[:, lo:hi]
    if sp.issparse(cols):
        return cols.tocsr() if sparse_ok else cols.toarray()
    return np.ascontiguousarray(cols)


class ItemItemFoldIn(FoldIn):
    """An item-item model's user (EASE, ``trainers/ease.py``; item-kNN, ``trainers/item_knn.py``,
    whose V is a CSR matrix of neighbour rows), exactly: the version's factors
    are ``U = X`` (each user's items as a 0/1 row) and ``V = Bᵀ``, so a new user's factor is
    the 0/1 row of the items they met (and the winners of their comparisons), and their
    scores ``V u = x · B``. Nothing to solve, nothing to derive. A model on some items only
    (the spec's ``items``: the item of each column) has a column per such item; the user's
    other items have none."""

    method = "item_item"
    keys = ()

    def check(self, spec: dict) -> None:
        items = spec.get("items")
        if items is not None and (not isinstance(items, list) or len(set(items)) != len(items)
                                  or not all(isinstance(i, int) and i >= 0 for i in items)):
            raise ValueError(f"fold_in items is {items!r:.60}, expected a list of distinct "
                             "item indices (one per column)")

    def user_factor(self, st, V, b, met, pairs, spec):
        return self.user_factors(st, V, b, [met], [pairs], spec)[0]

    def user_factors(self, st, V, b, mets, pairs, spec, starts=None, seen=None):
        items = spec.get("items")
        wide = V.shape[0] if items is None else len(items)
        if V.shape[1] != wide:
            raise ValueError(f"item_item fold_in needs a column per item "
                             f"({'items x items' if items is None else f'{wide} listed'}), "
                             f"the version's item factors are {V.shape[0]} x {V.shape[1]}")
        column = np.arange(wide) if items is None else np.full(V.shape[0], -1, np.int64)
        if items is not None:
            column[np.asarray(items, np.int64)] = np.arange(wide)
        U = np.zeros((len(mets), wide), np.float32)
        for n, (m, p) in enumerate(zip(mets, pairs)):
            met = np.concatenate([np.asarray(m, np.int64),
                                  np.asarray(p, np.int64).reshape(-1, 2)[:, 0]])
            cols = column[met]
            U[n, cols[cols >= 0]] = 1.0
        return U


FOLD_INS: dict[str, FoldIn] = {}


def register_fold_in(entry: FoldIn) -> FoldIn:
    """Add a fold-in method to :data:`FOLD_INS`; its name must be new."""
    return add_entry(FOLD_INS, entry.method, entry, "fold-in method")


for _method in (PairwiseFoldIn(), LeastSquaresFoldIn(), BlendFoldIn(), ItemItemFoldIn()):
    register_fold_in(_method)


def fold_in_method(name) -> FoldIn:
    """The registered fold-in ``name`` (or the ``module:Class`` it names)."""
    return registered(FOLD_INS, name, FoldIn, "fold-in method")


def fold_in(st: VersionState, factors, met: np.ndarray, pairs: np.ndarray, k: int,
            filt: ItemFilter) -> Recommendation:
    """Recommendations for a new user who met the item indices ``met`` and made the
    comparisons ``pairs``, by the version's fold-in (``st.fold_in``)."""
    V, b = factors
    try:
        method = fold_in_method(st.fold_in.get("method"))
    except ValueError as err:
        raise ValueError(f"model {st.model!r} version {st.version}: {err}") from None
    u = method.user_factor(st, V, b, met, pairs, st.fold_in)
    scores = V @ np.asarray(u).astype(np.float32)
    if b is not None:
        scores = scores + b
    return _answer(st, None, scores, k, None, filt, "fold_in")
