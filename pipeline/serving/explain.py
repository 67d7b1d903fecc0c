"""Why a user got an item: the served score split into one term per item the user met (or
comparison they made), exactly, for every shape a ``user_item`` version serves.

A served score is ``s = v_iᵀu + b_i`` (``u`` the user's factor as Redis holds it, ``v_i`` and
``b_i`` the item's factor and bias). Each shape writes ``u`` as a sum over the user's history,
so ``v_iᵀu`` splits into terms; the shape is the version's fold-in method (the ``fold_in``
meta field, the same spec that folds in a new user):

``pairwise`` (AltSVM)
    The user's problem with V fixed (Park et al. 2015, problem (5)) is
    ``min_u λ/2 ‖u‖² + Σ_c L(1 − uᵀd_c − o_c)`` with ``d_c = v_w − v_l``, ``o_c = b_w − b_l``
    over their comparisons c = (winner w, loser l); its dual gives ``u = (1/λ) Σ_c α_c d_c``,
    so ``s − b_i = Σ_c α_c d_cᵀv_i / λ``: one term per comparison. A met item's implicit
    comparisons (it against items the user did not meet, sampled as the fold-in samples them)
    are summed into one term of that item. α: for the squared hinge, stationarity of the
    primal at the fold-in's u, ``α_c = 2 max(0, 1 − d_cᵀu − o_c)``; for the other losses the
    dual coordinate descent's own α (the fold-in's solver, same seed).
``least_squares`` (implicit's ALS, as implicit's ``explain`` does it)
    With confidence c on met items, ``A = VᵀV + λI + (c − 1) Σ_j v_j v_jᵀ`` (Cholesky),
    ``u = A⁻¹ Σ_j c v_j``, so ``s − b_i = Σ_j c v_jᵀA⁻¹v_i`` (Hu, Koren & Volinsky 2008,
    section 5): one term per met item.
``item_item`` (EASE)
    ``u`` is the user's 0/1 row x of met items and ``V = Bᵀ``: ``s = Σ_j x_j B_ji``, one term
    per met item, read off the served factor itself.
``blend``
    Factors ``[a u₁, b u₂]`` against ``[V₁, V₂]``: each part's terms on its columns, times
    its scale (the blend's weight over the part's score spread).

**Exactness against the served score.** The version publishes no duals per comparison, so
the terms of ``pairwise`` and ``least_squares`` are recomputed from the user's met items (their
``seen`` key) by the version's own fold-in, and add up to ``v_iᵀũ`` for the recomputed factor
ũ. The served ``u`` is ũ when the refresher wrote it from the same items (``factor ==
"fresh"``); a trained user's ``u`` came from training (its own comparisons, or ALS's last
alternation), and differs. The answer therefore carries ``residual = s − b_i − Σ terms``
(= ``v_iᵀ(u − ũ)``) beside the terms: ``Σ terms + bias + residual = score`` always, and the
residual says how much of the served score the user's history, as the fold-in reads it, does
not account for. ``item_item`` reads its terms off ``u`` itself: its residual is rounding.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field

import numpy as np

from pipeline.serving.item_queries import (
    FOLD_IN_EPOCHS,
    FOLD_IN_GAP,
    PairwiseFoldIn,
    UnknownItemError,
    part_columns,
)
from pipeline.serving.layout import LayoutError, bucket_of, key_of, unpack_i32
from pipeline.serving.sparse_factors import dense_row, is_sparse, unpack_factor
from solvers.fold_in import pairwise_duals, pairwise_fold_in

CACHED_USERS = 256      # users' decompositions kept per version (the UI explains a whole list)
MAX_SUGGESTIONS = 100_000   # item ids searched for a "did you mean"


class UnknownUserError(LookupError):
    """The version keeps nothing of the user (their answers are the fallback list)."""


@dataclass
class Terms:
    """One part of a user's factor split by their history: the term of row ``t`` against an
    item factor ``v`` is ``(G @ v)[t]``, or ``w[t] · v[coords[t]]`` (item-item: one column
    per met item). ``items``: the met item (a comparison's winner) of each term; ``losers``:
    a comparison's loser, -1 for a met item's term; ``counts``: implicit comparisons summed
    into the term; ``factor``: the factor ũ the terms add up to (Σ_t term_t(v) = ũᵀv)."""

    items: np.ndarray
    losers: np.ndarray
    counts: np.ndarray
    factor: np.ndarray
    G: np.ndarray | None = None
    coords: np.ndarray | None = None
    w: np.ndarray | None = None

    def of(self, v: np.ndarray) -> np.ndarray:
        return self.G @ v if self.G is not None else self.w * v[self.coords]


@dataclass
class Part:
    """Terms of the columns ``lo:hi`` of the factors, scaled by ``scale`` (1 unless a blend)."""

    terms: Terms
    lo: int
    hi: int
    scale: float
    method: str


@dataclass
class Explanation:
    """What :meth:`~pipeline.serving.lookup.TopK.explain` answers (see the module).

    ``score`` = Σ of every term (``contributions`` holds the ``k`` largest, ``rest`` the sum
    of the others) + ``bias`` + ``residual``; a contribution's ``share`` is its term over the
    score. ``factor``: ``published`` (the user's factor as trained) or ``fresh`` (the
    refresher's fold-in); ``history``: the user's met items the version keeps (their ``seen``
    key); ``note``: why there is nothing to explain, when there is not."""

    model: str
    user: object
    item: object
    version: int
    score: float | None = None
    method: str = ""
    computed: str = ""
    factor: str = ""
    contributions: list = field(default_factory=list)
    n_terms: int = 0
    rest: float = 0.0
    bias: float = 0.0
    residual: float = 0.0
    history: list = field(default_factory=list)
    note: str | None = None

    def to_dict(self) -> dict:
        return {name: getattr(self, name) for name in self.__dataclass_fields__}


# ---------------------------------------------------------------------- the decompositions
def _empty(rank: int) -> Terms:
    none = np.zeros(0, np.int64)
    return Terms(none, none, none, np.zeros(rank), G=np.zeros((0, rank)))


def pairwise_terms(st, V, b, u, met, spec: dict) -> Terms:
    """AltSVM: one term per met item, its implicit comparisons' ``α_c d_c / λ`` summed."""
    V64 = np.asarray(V, np.float64)
    rows = PairwiseFoldIn.drawn(st, [met], spec)[0]      # the fold-in's own, same seed
    if not len(rows):
        return _empty(V64.shape[1])
    reg, loss = float(spec["reg"]), spec["loss"]
    bias = np.zeros(len(V64)) if b is None else np.asarray(b, np.float64)
    D = V64[rows[:, 0]] - V64[rows[:, 1]]
    if loss == "squared_hinge":
        # stationarity of λ/2‖u‖² + Σ ξ_c², ξ_c = max(0, 1 − d_cᵀu − o_c): λu = Σ 2ξ_c d_c
        uf = pairwise_fold_in(V64, bias, rows, reg=reg, loss=loss, max_epochs=FOLD_IN_EPOCHS,
                              gap_tol=FOLD_IN_GAP)
        alpha = 2.0 * np.maximum(0.0, 1.0 - D @ uf - (bias[rows[:, 0]] - bias[rows[:, 1]]))
    else:   # the dual solver keeps u = (1/λ) Σ α_c d_c itself
        _, alpha = pairwise_duals(V64, bias, rows, reg=reg, loss=loss,
                                  max_epochs=FOLD_IN_EPOCHS, gap_tol=FOLD_IN_GAP)
    winners, group = np.unique(rows[:, 0], return_inverse=True)
    G = np.zeros((len(winners), V64.shape[1]))
    np.add.at(G, group, (alpha / reg)[:, None] * D)
    return Terms(winners, np.full(len(winners), -1), np.bincount(group), G.sum(axis=0), G=G)


def least_squares_terms(st, V, b, u, met, spec: dict) -> Terms:
    """ALS: ``c A⁻¹ v_j`` per met item j (implicit's ``explain``)."""
    from scipy.linalg import cho_factor, cho_solve

    V64 = np.asarray(V, np.float64)
    if not len(met):
        return _empty(V64.shape[1])
    gram = st.derived.get("explain:gram")      # VᵀV, once per version (or blend part)
    if gram is None:
        gram = st.derived["explain:gram"] = V64.T @ V64
    reg, c = float(spec["reg"]), float(spec["alpha"])
    Y = V64[met]
    A = gram + reg * np.eye(V64.shape[1]) + (c - 1.0) * (Y.T @ Y)
    G = c * cho_solve(cho_factor(A), Y.T).T          # row j: c A⁻¹ v_j (A is symmetric)
    return Terms(np.asarray(met), np.full(len(met), -1), np.zeros(len(met), np.int64),
                 G.sum(axis=0), G=G)


def item_item_terms(st, V, b, u, met, spec: dict) -> Terms:
    """EASE: ``x_j B_ji`` per met item j, x the served 0/1 row (``V[i, c] = B_ji`` for the
    column c of item j: every item's, or those the spec's ``items`` lists)."""
    items = spec.get("items")
    if V.shape[1] != (V.shape[0] if items is None else len(items)):
        raise LayoutError(f"model {st.model!r} version {st.version}: item_item factors are "
                          f"{V.shape[0]} x {V.shape[1]}, expected a column per item")
    x = np.asarray(u, np.float64)
    coords = np.flatnonzero(x)
    met_items = coords if items is None else np.asarray(items, np.int64)[coords]
    return Terms(met_items, np.full(len(coords), -1), np.zeros(len(coords), np.int64), x,
                 coords=coords, w=x[coords])


TERMS = {"pairwise": pairwise_terms, "least_squares": least_squares_terms,
         "item_item": item_item_terms}
COMPUTED = {
    "pairwise": "recomputed from the user's met items by the version's fold-in (AltSVM's "
                "pairwise problem with the item factors fixed, each met item winning sampled "
                "comparisons): u = Σ α_c (v_winner − v_loser) / λ, each met item's term the "
                "sum over its comparisons (the version publishes no duals)",
    "least_squares": "recomputed from the user's met items as implicit's explain does: "
                     "term_j = c v_jᵀ (VᵀV + λI + (c − 1) Σ v_j v_jᵀ)⁻¹ v_item",
    "item_item": "read off the served factor: an item-item model's user factor is their 0/1 "
                 "row of met items, term_j = B[j, item]",
}


# what a trained factor holds beyond the recomputation from the met items, per method
TRAINED = {
    "pairwise": "training's own comparisons (its sampled losers, ratings and comparison "
                "events) differ from the fold-in's",
    "least_squares": "ALS's last user step was taken against the item factors before their "
                     "last update, and by conjugate gradient",
}


def user_parts(st, V, b, u, met) -> list[Part] | None:
    """The user's factor ``u`` (float32, served) split by their met items ``met`` (indices),
    part by part; None when the version's fold-in has no decomposition here."""
    spec = st.fold_in or {}
    method = spec.get("method")
    if method == "blend":
        out = []
        for n, part in enumerate(spec.get("parts", ())):
            lo, hi = (int(x) for x in part["columns"])
            scale = float(part["scale"])
            make = TERMS.get(part.get("method"))
            if make is None or scale == 0.0:
                return None
            Vp = part_columns(V, lo, hi, sparse_ok=part.get("method") == "item_item")
            bp = b / scale if n == 0 and b is not None else None   # the first part's bias
            terms = make(_Columns(st, lo, hi), Vp, bp, u[lo:hi] / scale, met, part)
            out.append(Part(terms, lo, hi, scale, part["method"]))
        return out or None
    make = TERMS.get(method)
    if make is None:
        return None
    return [Part(make(st, V, b, u, met, spec), 0, V.shape[1], 1.0, method)]


class _Columns:
    """A blend part's view of the version: its own cache of derived arrays."""

    def __init__(self, st, lo: int, hi: int):
        self.n_items, self.model, self.version = st.n_items, st.model, st.version
        self.derived = st.derived.setdefault(f"explain:{lo}:{hi}", {})


def cached_parts(st, key: str, raw: tuple, make):
    """``make()`` once per user and value of their keys (``raw``), per version."""
    cache = st.derived.setdefault("explain:users", OrderedDict())
    found = cache.get((key, raw))
    if found is None:
        found = cache[(key, raw)] = make()
        while len(cache) > CACHED_USERS:
            cache.popitem(last=False)
    else:
        cache.move_to_end((key, raw))
    return found


# ---------------------------------------------------------------------- one item's answer
def fill(out: Explanation, parts: list[Part], factors, u, i: int, k: int,
         item_ids: list) -> Explanation:
    """``out`` with the served score of item index ``i`` split by ``parts`` (see the module):
    the ``k`` largest terms, the sum of the rest, the bias and the residual."""
    V, b = factors
    v = dense_row(V, i)
    out.bias = float(b[i]) if b is not None else 0.0
    out.score = float(v @ np.asarray(u, np.float64)) + out.bias
    terms = [p.scale * p.terms.of(v[p.lo:p.hi]) for p in parts]
    where = [(n, t) for n, part in enumerate(terms) for t in range(len(part))]
    every = np.concatenate(terms) if terms else np.zeros(0)
    explained = float(every.sum())
    out.residual = out.score - out.bias - explained   # = v_iᵀ(u − ũ), see the module
    out.n_terms = len(every)
    top = np.argsort(-every, kind="stable")[:k]
    out.rest = explained - float(every[top].sum())
    out.contributions = [_contribution(parts, *where[j], float(every[j]), out.score, item_ids)
                         for j in top.tolist()]
    return out


def _contribution(parts: list[Part], n: int, t: int, term: float, score: float,
                  item_ids: list) -> dict:
    """One term as the answer lists it: the met item (a comparison's winner and loser), the
    term, its share of the score; a blend's part; implicit comparisons summed into it."""
    terms = parts[n].terms
    out = {"item": item_ids[int(terms.items[t])], "term": term,
           "share": term / score if score else None}
    if terms.losers[t] >= 0:
        out = {"winner": out.pop("item"), "loser": item_ids[int(terms.losers[t])], **out}
    if terms.counts[t]:
        out["comparisons"] = int(terms.counts[t])
    if len(parts) > 1:
        out.update(part=n, method=parts[n].method)
    return out


def computed(parts: list[Part], fresh: bool) -> str:
    """How the terms were computed, and what the residual is, in words."""
    methods = list(dict.fromkeys(p.method for p in parts))
    how = "; ".join(COMPUTED[m] for m in methods)
    if len(parts) > 1:
        how = f"a blend of {len(parts)} parts, each part's terms times its scale: " + how
    if methods == ["item_item"]:
        return how + ". Exact: the residual is float rounding."
    trained = "; ".join(TRAINED[m] for m in methods if m in TRAINED)
    whose = ("the served factor is the refresher's fold-in of the user's events (the residual "
             "is what those events hold beyond the met items)" if fresh else
             f"the served factor is the trained one (the residual: {trained})")
    return f"{how}. Terms + bias + residual = score; {whose}."


# ---------------------------------------------------------------------- reading a user
def explain(lists, st, user, item, k: int) -> Explanation:
    """The explanation of ``item`` for ``user`` by version ``st`` (read through ``lists``, a
    :class:`~pipeline.serving.list_reads.ListReads`: one round trip for the user's keys)."""
    out = Explanation(st.model, user, item, st.version)
    if not st.per_key or not st.rank:
        return _no_history(out, st, item)
    i = st.index_of(item)
    if i is None:
        raise UnknownItemError(unknown_item(st, item))
    key = user if type(user) is str else key_of(user)
    bk = bucket_of(key)
    names = [p[bk] + key for p in (st.user_prefixes, st.seen_prefixes, st.fresh_prefixes,
                                   st.topk_prefixes)]
    pointers, values, _ = lists.transport.bucket_mget(st, [bk], names, 4)
    lists.versions.check_pointers(st, pointers)
    u_raw, seen_raw, fresh, listed = values
    if u_raw is None:
        if listed is None:
            raise UnknownUserError(unknown_user(lists.transport, st, user, key))
        out.note = (f"model {st.model!r} version {st.version} keeps a list for this user but "
                    "no factor: there is no score to split")
        return out
    u = unpack_factor(u_raw, names[0], st.rank, sparse=is_sparse(st.meta))
    seen = np.zeros(0, np.int64) if seen_raw is None else unpack_i32(seen_raw, names[1])
    if len(seen) and (seen.min() < 0 or seen.max() >= st.n_items):
        raise LayoutError(f"{names[0]} / {names[1]} do not fit version {st.version} (rank "
                          f"{st.rank}, {st.n_items} items)")
    factors = lists.factors(st)
    met = np.unique(seen.astype(np.int64))
    parts = cached_parts(st, key, (u_raw, seen_raw),
                         lambda: user_parts(st, *factors, u, met))
    out.factor = "fresh" if fresh is not None else "published"
    out.history = [st.item_ids[j] for j in seen.tolist()]
    out.method = (st.fold_in or {}).get("method", "")
    if parts is None:
        V, b = factors
        out.bias = float(b[i]) if b is not None else 0.0
        out.score = float(dense_row(V, i) @ u) + out.bias
        out.residual = out.score - out.bias
        out.note = (f"model {st.model!r} version {st.version} has no fold-in to split its "
                    f"scores by (fold_in method {out.method or 'none'!r})")
        return out
    out.computed = computed(parts, fresh is not None)
    return fill(out, parts, factors, u, i, k, st.item_ids)


def _no_history(out: Explanation, st, item) -> Explanation:
    """A version that keeps no per-user state: say so, with the item's score in its list."""
    served = st.meta.get("served_as", "model")
    what = ("a trivial list (the trained model did not beat it)" if served == "trivial"
            else f"a {st.kind} model")
    out.method = "none"
    out.note = (f"model {st.model!r} version {st.version} serves {what}: one list for "
                "everyone (or per query), so there is no user history to explain with")
    if st.index_of(item) is None:
        raise UnknownItemError(unknown_item(st, item))
    scores = dict(st.global_items or ())
    found = scores.get(st.item_ids[st.index_of(item)])
    out.score = None if found is None else float(found)
    return out


def unknown_item(st, item) -> str:
    """Why ``item`` cannot be explained, with a "did you mean" among the version's ids."""
    import difflib

    reason = f"item {str(item)[:60]!r} is not in model {st.model!r} version {st.version}"
    names = st.derived.get("explain:names")
    if names is None:
        ids = st.item_ids if len(st.item_ids) <= MAX_SUGGESTIONS else []
        names = st.derived["explain:names"] = [str(x) for x in ids]
    close = difflib.get_close_matches(str(item)[:100], names, n=3, cutoff=0.6)
    return reason + (f"; did you mean {' or '.join(repr(c) for c in close)}?" if close else "")


def unknown_user(transport, st, user, key: str) -> str:
    """Why ``user`` cannot be explained, with a "did you mean" among the spellings of their
    id the version knows (case, spaces, leading zeros: one round trip)."""
    reason = (f"user {str(user)[:60]!r} is not in model {st.model!r} version {st.version} "
              "(their answers are the fallback list, which no history explains)")
    spellings = [x for x in dict.fromkeys((key.strip(), key.lower(), key.upper(), key.title(),
                                           key.lstrip("0"))) if x and x != key]
    if not spellings:
        return reason
    asks = [(bucket_of(x), ("EXISTS", st.user_prefixes[bucket_of(x)] + x)) for x in spellings]
    close = [x for x, found in zip(spellings, transport.send_many(st.keys, asks)) if found]
    return reason + (f"; did you mean {' or '.join(repr(c) for c in close)}?" if close else "")
