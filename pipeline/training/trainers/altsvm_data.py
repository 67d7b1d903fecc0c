"""AltSVM's dataset: rating, interaction and comparison events -> comparisons (user, winner,
loser) over stable indices, with a per-user holdout of each user's latest ratings
(:func:`collaborative`). The ALS challenger (:mod:`.als`) and the tuning (:mod:`.altsvm_tuning`)
read the same arrays; :mod:`.altsvm_comparisons` makes comparisons as the builder does.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa

from pipeline.ingest.store import EventStore
from pipeline.training.datasets import (
    TEST,
    TRAIN,
    VALIDATION,
    Window,
    event_ids,
    holdout_latest,
    id_indices,
    iso_date,
    latest_per_key,
    stable_split,
    window_tables,
)
from pipeline.training.idmap import IdMap
from pipeline.training.trainers.altsvm_comparisons import loser_counts, make_comparisons

DERIVED = ("comparisons", "path_comparisons", "net_wins")
"""Arrays made from the met rows on demand (:func:`.altsvm_comparisons.training_comparisons`),
never stored: a dataset bundle holds the events' rows (bytes per met row: 25), not their
comparisons (24 bytes each, up to ``implicit_per_user`` per user), which a resumed step makes
again, the same bits from the same rows and seed. ``net_wins``: each item's wins − losses in
the comparisons a tuned fit used (the ``global`` baseline), kept where those comparisons are
not."""


@dataclass
class CollaborativeData:
    """AltSVM's inputs. ``met`` holds one row per (user, item) the user met in the window (a
    rating or an interaction), with its rating (NaN for an interaction) and its part: TRAIN,
    VALIDATION (a holdout inside the training data, for choosing λ) or TEST (the evaluation
    holdout). ``comparison_events`` are the window's comparison events (user, winner, loser).
    ``comparisons`` come from TRAIN and VALIDATION rows (the final fit), made by
    :func:`training_comparisons` under the config's parameters: kept in memory for the fit of
    the same process, left out of the bundle (:data:`DERIVED`)."""

    users: IdMap
    items: IdMap
    comparisons: np.ndarray           # (n, 3) int64: user, winner, loser
    comparison_events: np.ndarray     # (n, 3) int64
    met: dict                         # user, item, rating, part
    window: Window
    stats: dict = field(default_factory=dict)
    tuning_users: np.ndarray | None = None   # the searches' users, when not every user
    loser_counts: np.ndarray | None = None   # what popular losers are drawn by

    def to_arrays(self) -> dict:
        """The dataset's arrays: the id maps, the resolved relevance threshold, the
        comparison events, the ``met_*`` rows, the searches' sample of users (when there is
        one) and (in memory only) the comparisons."""
        sample = {} if self.tuning_users is None else {"tuning_users": self.tuning_users}
        if self.loser_counts is not None:
            sample["loser_counts"] = self.loser_counts
        return {"user_ids": self.users.ids, "item_ids": self.items.ids,
                "relevance": np.float64(self.stats["relevance"]),
                "comparison_events": self.comparison_events, "comparisons": self.comparisons,
                **sample, **{f"met_{k}": v for k, v in self.met.items()}}


RELEVANT_SHARE = 0.75   # "auto" relevance: this far from the lowest to the highest rating
# a value at either end of a discrete scale (at most STAR_VALUES distinct ratings) is a stray
# when it lies more than the scale's step apart from the next one and the strays hold at most
# this share of the ratings: two ratings of 7 and -2 among MovieLens's 1-5 stars moved "auto"
# from 4 to 4.75 (only 5 stars relevant) without a word
STRAY_SHARE = 0.001
STAR_VALUES = 50


def rating_bulk(rated: np.ndarray) -> tuple[float, float, list]:
    """``(lo, hi, strays)``: the scale of the ratings without the stray values at its ends
    (see ``STRAY_SHARE``), and those values.

    >>> rating_bulk(np.array([1.0, 2, 3, 4, 5] * 400 + [7.0, -2.0]))
    (1.0, 5.0, [-2.0, 7.0])
    >>> rating_bulk(np.array([1.0, 2, 3, 4, 5, 5]))
    (1.0, 5.0, [])
    """
    values, counts = np.unique(rated, return_counts=True)
    if not 3 <= len(values) <= STAR_VALUES:
        return float(values[0]), float(values[-1]), []
    step, budget = float(np.diff(values).min()), STRAY_SHARE * float(counts.sum())
    a, b, used = 0, len(values) - 1, 0
    while b - a > 1 and used + counts[a] <= budget and values[a + 1] - values[a] > step:
        used, a = used + counts[a], a + 1
    while b - a > 1 and used + counts[b] <= budget and values[b] - values[b - 1] > step:
        used, b = used + counts[b], b - 1
    strays = [float(v) for v in np.concatenate([values[:a], values[b + 1:]])]
    return float(values[a]), float(values[b]), strays


def relevance_threshold(ratings: np.ndarray, configured) -> tuple[float, str | None]:
    """The least rating that counts as relevant, and a warning when it sorts no or almost
    every rating into one class.

    ``"auto"`` follows the data's scale: ``lo + 0.75 (hi − lo)`` over the ratings seen, so 4
    on a 1–5 scale, 3.875 (4 and up) on half stars 0.5–5, 7.75 (8 and up) on 1–10 and 0.75 on
    0–1 scores, stray values at its ends left out with a warning naming ``rating_range``
    (:func:`rating_bulk`); a number is taken as given. Interactions (NaN ratings) are always
    relevant.

    >>> relevance_threshold(np.array([1.0, 3, 5, 4, 2]), "auto")
    (4.0, None)
    >>> relevance_threshold(np.array([0.5, 5.0, 4.5, 3.0, 4.0]), "auto")[0]
    3.875
    >>> relevance_threshold(np.array([1.0, 2, 3]), 4.0)[1][:59]
    'no rating reaches the relevance threshold 4 (ratings run fr'
    """
    rated = ratings[np.isfinite(ratings)]
    if rated.size == 0:
        return (float(configured) if configured != "auto" else 0.0), None
    lo, hi, strays = rating_bulk(rated)
    value = lo + RELEVANT_SHARE * (hi - lo) if configured == "auto" else float(configured)
    share = float(np.mean(rated >= value))
    scale = f"ratings run from {lo:g} to {hi:g}"
    if strays and configured == "auto":
        n = int(np.isin(rated, strays).sum())
        stray = (f"{n} rating(s) of {', '.join(f'{v:g}' for v in strays)} lie apart from the "
                 f"scale of the rest ({lo:g} to {hi:g}): the automatic relevance threshold "
                 f"{value:g} is taken on that scale; declare it with params.rating_range = "
                 f"[{lo:g}, {hi:g}] to leave them out, or fix the source")
        return value, stray
    if share == 0.0:
        return value, (f"no rating reaches the relevance threshold {value:g} ({scale}): every "
                       "rated item counts as not relevant; set evaluation.relevance within "
                       'the scale, or "auto"')
    if share < 0.01 and rated.size >= 100 and configured == "auto":
        return value, (f"only {share:.2%} of the ratings reach the relevance threshold "
                       f"{value:g} ({scale}): a stray rating stretches the scale? declare it "
                       "with params.rating_range")
    if share > 0.95 and rated.size >= 20:
        return value, (f"{share:.0%} of the ratings reach the relevance threshold {value:g} "
                       f"({scale}): almost every rated item counts as relevant; raise "
                       'evaluation.relevance, or "auto"')
    return value, None


def collaborative(store: EventStore, kinds=("rating",), *, window=None, users: IdMap | None = None,
                  items: IdMap | None = None, split: str = "per_user_last", holdout: int = 5,
                  fraction: float = 0.2, min_train: int = 5, comparisons: str = "implicit",
                  implicit_per_item: int = 10, implicit_sampling: str = "uniform",
                  implicit_per_user: int = 0, implicit_min_rating=0.0,
                  implicit_max_per_positive: int = 0, implicit_max_comparisons: int = 0,
                  max_pairs_per_user: int | None = None, relevance="auto", rating_range=None,
                  validation_users: int = 0, seed: int = 0, previous=None) -> CollaborativeData:
    """AltSVM inputs from rating, interaction and comparison events.

    Every (user, item) a user met (rated or interacted with; the latest event wins) is a
    ``met`` row. Held out for evaluation (TEST): with ``split="per_user_last"`` the
    ``holdout`` latest rows of each user with at least ``holdout + min_train`` of them; with
    ``split="random"`` a stable ``fraction`` chosen by a hash of (user, item, seed), so a row
    stays on its side as data grows. VALIDATION is carved out of the rest the same way (seed
    + 1), for choosing λ on the regularization path and every other setting; past
    ``validation_users`` users (0: no limit) only from that many (:func:`tuning_sample`), and
    the searches fit and score those users alone (:func:`tuning_view`): a search's cost is a
    count, the chosen setting is fitted on all.

    Comparisons (``comparisons``): ``"explicit"``, within-user pairs of TRAIN ratings with
    different ratings (plus comparison events); ``"implicit"``, "the user met item i, so i
    beats a sampled item the user never met", ``implicit_per_item`` per met row, or
    ``implicit_per_user`` per user in all when it is not 0 (every user weighs the same)
    (:func:`solvers.pairs.implicit_comparisons`, ``implicit_sampling`` uniform or by
    popularity, counted as :func:`.altsvm_comparisons.loser_counts` counts it from
    ``previous``; at most ``implicit_max_per_positive`` per winning row when it is not 0,
    lowered where all would pass ``implicit_max_comparisons``: :mod:`.altsvm_comparisons`);
    only rows rated at least ``implicit_min_rating`` (and interactions) win, the others are
    met and never sampled as losers (``"relevance"``: the relevance threshold); ``"mixed"``,
    both. ``max_pairs_per_user`` caps each kind per user, by a stable hash, and the stats say
    how many were dropped. :func:`relevance_threshold` resolves ``relevance`` (``stats``).
    ``rating_range = [low, high]``, the rating scale: ratings outside it are left out and
    counted (``stats["ratings_out_of_range"]``, warned), so a stray -3 on 1–5 stars is neither
    a preference nor a move of the "auto" threshold.
    """
    low, high = parse_rating_range(rating_range)
    known_users = 0 if users is None else len(users)
    tables, win = window_tables(store, kinds, window or {}, COLUMNS, key="user")
    users, items, (u, i, r, ts, off) = _met_events(tables, users or IdMap(), items or IdMap())
    users, items, explicit = _comparison_events(tables, users, items)
    outside = ~np.isnan(r) & ((r < low) | (r > high))
    if outside.any():       # before the latest is taken: the rating before a stray one counts
        u, i, r, ts, off = (a[~outside] for a in (u, i, r, ts, off))
    keep = latest_per_key(u * (2**31) + i, ts, off)    # a rating after a view wins, ...
    u, i, r, ts = u[keep], i[keep], r[keep], ts[keep]
    relevance, relevance_warning = relevance_threshold(r, relevance)
    if implicit_min_rating == "relevance":
        implicit_min_rating = relevance
    part = np.full(len(u), TRAIN, np.int8)
    part[_split(u, i, ts, split, holdout, fraction, min_train, seed)] = TEST
    rest = np.flatnonzero(part == TRAIN)
    validation = _split(u[rest], i[rest], ts[rest], split, holdout, fraction, min_train, seed + 1)
    sample = tuning_sample(u[rest], validation_users, seed)
    if sample is not None:
        validation &= np.isin(u[rest], sample)
    part[rest[validation]] = VALIDATION

    rows = part != TEST
    counts, drift = loser_counts(i[rows], len(items), previous)
    comps, dropped = make_comparisons(
        u[rows], i[rows], r[rows], len(items), explicit=explicit, comparisons=comparisons,
        implicit_per_item=implicit_per_item, implicit_sampling=implicit_sampling,
        implicit_per_user=implicit_per_user, implicit_min_rating=implicit_min_rating,
        implicit_max_per_positive=implicit_max_per_positive, max_pairs_per_user=max_pairs_per_user,
        implicit_max_comparisons=implicit_max_comparisons, user_ids=users.ids, seed=seed,
        loser_counts=counts)
    stats = {"met": int(len(u)), "ratings": int(np.isfinite(r).sum()),
             "loser_counts_drift": round(drift, 4),
             "interactions": int(np.isnan(r).sum()), "comparison_events": int(len(explicit)),
             "comparisons": int(len(comps)), "validation": int((part == VALIDATION).sum()),
             "test": int((part == TEST).sum()), "users": len(users), "items": len(items),
             "max_pairs_per_user": max_pairs_per_user or 0, "relevance": relevance,
             **{f"comparisons_dropped_{k}": int(v) for k, v in dropped.items()}}
    _warnings(stats, u, win, known_users, int(outside.sum()), (low, high), relevance_warning)
    stats.update({} if sample is None else {"tuning_users": int(len(sample))})
    return CollaborativeData(users=users, items=items, comparisons=comps,
                             comparison_events=explicit, tuning_users=sample, loser_counts=counts,
                             met={"user": u, "item": i, "rating": r, "part": part},
                             window=win, stats=stats)


COLUMNS = {"rating": ["ts", "offset", "user", "item", "rating"],
           "interaction": ["ts", "offset", "user", "item"],
           "comparison": ["ts", "offset", "event_id", "user", "winner", "loser"]}


def _met_events(tables: dict, users: IdMap, items: IdMap) -> tuple:
    """``(users, items, (u, i, r, ts, offset))``: every rating and interaction event as
    indices (an interaction's rating is NaN), the id maps extended."""
    parts = []
    for kind in ("rating", "interaction"):
        t = tables.get(kind)
        if t is None or not t.num_rows:
            continue
        users, u = id_indices(users, t.column("user"))
        items, i = id_indices(items, t.column("item"))
        r = t.column("rating").to_numpy() if kind == "rating" else np.full(len(u), np.nan)
        parts.append((u, i, r, t.column("ts").to_numpy(), t.column("offset").to_numpy()))
    if not parts:
        empty = np.zeros(0, np.int64)
        return users, items, (empty, empty, np.zeros(0), empty, empty)
    u, i, r, ts, off = (np.concatenate(column) for column in zip(*parts))
    return users, items, (u.astype(np.int64), i.astype(np.int64), r, ts, off)


def _comparison_events(tables: dict, users: IdMap, items: IdMap) -> tuple:
    """``(users, items, (n, 3) user/winner/loser rows)`` of the comparison events, each event
    once (one re-sent, or re-read from an edited file, counts once)."""
    t = tables.get("comparison")
    if t is None or not t.num_rows:
        return users, items, np.zeros((0, 3), np.int64)
    t = t.take(pa.array(latest_per_key(event_ids(t.column("event_id")),
                                       t.column("ts").to_numpy(), t.column("offset").to_numpy())))
    users, c_user = id_indices(users, t.column("user"))
    items, c_win = id_indices(items, t.column("winner"))
    items, c_lose = id_indices(items, t.column("loser"))
    return users, items, np.column_stack([c_user, c_win, c_lose]).astype(np.int64)


def _warnings(stats: dict, u, win, known_users: int, outside: int, scale: tuple,
              relevance_warning) -> None:
    """Add ``users_in_window`` and what a person should know (``warning``) to ``stats``: a
    window that keeps few of the users seen before, ratings outside the declared scale, a
    relevance threshold that sorts (almost) every rating into one class."""
    in_window = int(np.count_nonzero(np.bincount(u))) if len(u) else 0   # distinct users
    stats["users_in_window"] = in_window
    if win.warning is None and known_users and in_window < 0.5 * known_users:
        stats["warning"] = (f"the window keeps {in_window:,} of the {known_users:,} users "
                            "seen before (events from "
                            f"{iso_date(win.start_ts) if win.start_ts else 'the start'}); the "
                            "others get the fallback list: widen the window?")
    if outside:
        stats["ratings_out_of_range"] = outside
        relevance_warning = "; ".join(filter(None, [
            f"{outside:,} ratings are outside {scale[0]:g}..{scale[1]:g} "
            "(params.rating_range): left out", relevance_warning]))
    if relevance_warning:
        stats["warning"] = "; ".join(filter(None, [stats.get("warning"), relevance_warning]))


def parse_rating_range(declared) -> tuple[float, float]:
    """``(low, high)`` of a declared rating scale (``None``: any rating).

    >>> parse_rating_range([1, 5]), parse_rating_range(None)
    ((1.0, 5.0), (-inf, inf))
    """
    if declared is None:
        return -np.inf, np.inf
    try:
        low, high = (float(v) for v in declared)
    except (TypeError, ValueError):
        low = high = np.nan
    if not low < high:
        raise ValueError(f"params.rating_range is {declared!r}, expected [low, high] with "
                         "low < high (the model's rating scale)")
    return low, high


def tuning_sample(users: np.ndarray, n: int, seed: int) -> np.ndarray | None:
    """The ``n`` users (sorted indices) of ``users`` whose hash of (index, seed) is smallest,
    or None when there are at most ``n`` (or ``n`` is 0): every user. Stable as data grows:
    user indices never change, and a new user enters the sample only by a smaller hash.

    >>> tuning_sample(np.array([3, 3, 1, 7, 9]), 2, 0).size, tuning_sample(np.arange(5), 5, 0)
    (2, None)
    """
    distinct = np.unique(users)
    if n <= 0 or distinct.size <= n:
        return None
    from solvers._random import GOLDEN, mix64

    with np.errstate(over="ignore"):
        h = mix64(distinct.astype(np.uint64) + np.uint64(seed + 2) * GOLDEN)
    return np.sort(distinct[np.argsort(h, kind="stable")[:n]])


def tuning_view(arrays: dict) -> dict:
    """``arrays`` with the met rows of the searches' users alone (the dataset's
    ``tuning_users``; the id maps as they are, so factors keep their shapes), or ``arrays``
    itself when every user is searched. Its TRAIN rows are what a search fits, its
    VALIDATION rows (only those users have any) what it scores; its popularity-sampled losers
    are drawn by the sample's own counts, not the whole data's ``loser_counts``: on
    amazon-beauty's 10,000 of 52,000 users, the whole data's made popular losers score 0.0063
    (NDCG@10, rank 20) and the search chose uniform ones (0.0066), where the sample's own
    score 0.0091: a sample's counts are to its fit what the whole data's are to the final
    fit. Memory: the sample's rows."""
    if "tuning_users" not in arrays:
        return arrays
    rows = np.isin(arrays["met_user"], arrays["tuning_users"])
    view = {k: v for k, v in arrays.items() if k not in DERIVED + ("loser_counts",)}
    view.update({k: v[rows] for k, v in arrays.items() if k.startswith("met_")})
    return view


def _split(u, i, ts, split: str, holdout: int, fraction: float, min_train: int,
           seed: int) -> np.ndarray:
    """Row mask of a holdout: a stable random ``fraction``, or each user's latest rows."""
    if split == "random":
        return stable_split(u * (2**31) + i, fraction, seed)
    if holdout > 0:
        return holdout_latest(u, ts, holdout, min_train)
    return np.zeros(len(u), dtype=bool)
