"""AltSVM's dataset: rating, interaction and comparison events -> comparisons (user, winner,
loser) over stable indices, with a per-user holdout of each user's latest ratings
(:func:`collaborative`). The ALS challenger (:mod:`.als`) and the tuning (:mod:`.altsvm_tuning`)
read the same arrays; :func:`make_comparisons` makes comparisons as the builder does.
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


@dataclass
class CollaborativeData:
    """AltSVM's inputs. ``met`` holds one row per (user, item) the user met in the window (a
    rating or an interaction), with its rating (NaN for an interaction) and its part: TRAIN,
    VALIDATION (a holdout inside the training data, for choosing λ) or TEST (the evaluation
    holdout). ``comparisons`` come from TRAIN and VALIDATION rows (the final fit);
    ``path_comparisons`` from TRAIN rows alone (the fits scored on VALIDATION)."""

    users: IdMap
    items: IdMap
    comparisons: np.ndarray           # (n, 3) int64: user, winner, loser
    path_comparisons: np.ndarray
    met: dict                         # user, item, rating, part
    window: Window
    stats: dict = field(default_factory=dict)

    def to_arrays(self) -> dict:
        """The dataset bundle's arrays: the id maps, the resolved relevance threshold, both
        comparison sets and the ``met_*`` rows."""
        return {"user_ids": self.users.ids, "item_ids": self.items.ids,
                "relevance": np.float64(self.stats["relevance"]),
                "comparisons": self.comparisons, "path_comparisons": self.path_comparisons,
                **{f"met_{k}": v for k, v in self.met.items()}}


RELEVANT_SHARE = 0.75   # "auto" relevance: this far from the lowest to the highest rating


def relevance_threshold(ratings: np.ndarray, configured) -> tuple[float, str | None]:
    """The least rating that counts as relevant, and a warning when it sorts no or almost
    every rating into one class.

    ``"auto"`` follows the data's scale: ``lo + 0.75 (hi − lo)`` over the ratings seen, so 4
    on a 1–5 scale, 3.875 (4 and up) on half stars 0.5–5, 7.75 (8 and up) on 1–10 and 0.75 on
    0–1 scores; a number is taken as given. Interactions (NaN ratings) are always relevant.

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
    lo, hi = float(rated.min()), float(rated.max())
    value = lo + RELEVANT_SHARE * (hi - lo) if configured == "auto" else float(configured)
    share = float(np.mean(rated >= value))
    scale = f"ratings run from {lo:g} to {hi:g}"
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
                  max_pairs_per_user: int | None = None, relevance="auto",
                  rating_range=None, seed: int = 0) -> CollaborativeData:
    """AltSVM inputs from rating, interaction and comparison events.

    Every (user, item) a user met (rated or interacted with; the latest event wins) is a
    ``met`` row. Held out for evaluation (TEST): with ``split="per_user_last"`` the
    ``holdout`` latest rows of each user with at least ``holdout + min_train`` of them; with
    ``split="random"`` a stable ``fraction`` chosen by a hash of (user, item, seed), so a row
    stays on its side as data grows. VALIDATION is carved out of the rest the same way (seed
    + 1), for choosing λ on the regularization path.

    Comparisons (``comparisons``): ``"explicit"``, within-user pairs of TRAIN ratings with
    different ratings (plus comparison events); ``"implicit"``, "the user met item i, so i
    beats a sampled item the user never met", ``implicit_per_item`` per met row, or
    ``implicit_per_user`` per user in all when it is not 0 (every user weighs the same)
    (:func:`solvers.pairs.implicit_comparisons`, ``implicit_sampling`` uniform or by
    popularity); only rows rated at least ``implicit_min_rating`` (and interactions) win, the
    others are met and never sampled as losers (``"relevance"``: the relevance threshold);
    ``"mixed"``, both. ``max_pairs_per_user`` caps each kind per user, by a stable hash, and
    the stats say how many were dropped. ``relevance`` is resolved by
    :func:`relevance_threshold` on the window's ratings (``stats["relevance"]``).

    ``rating_range = [low, high]`` declares the model's rating scale: ratings outside it are
    left out and counted (``stats["ratings_out_of_range"]``, with a warning), so one stray
    rating (-3 on a 1–5 scale) neither counts as a preference nor moves the "auto" threshold.
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
    part[rest[_split(u[rest], i[rest], ts[rest], split, holdout, fraction, min_train,
                     seed + 1)]] = VALIDATION

    def build(rows) -> tuple[np.ndarray, dict]:
        return make_comparisons(u[rows], i[rows], r[rows], len(items), explicit=explicit,
                                comparisons=comparisons, implicit_per_item=implicit_per_item,
                                implicit_sampling=implicit_sampling,
                                implicit_per_user=implicit_per_user,
                                implicit_min_rating=implicit_min_rating,
                                max_pairs_per_user=max_pairs_per_user, seed=seed)

    comps, dropped = build(np.flatnonzero(part != TEST))
    path_comps, _ = build(np.flatnonzero(part == TRAIN))
    stats = {"met": int(len(u)), "ratings": int(np.isfinite(r).sum()),
             "interactions": int(np.isnan(r).sum()), "comparison_events": int(len(explicit)),
             "comparisons": int(len(comps)), "validation": int((part == VALIDATION).sum()),
             "test": int((part == TEST).sum()), "users": len(users), "items": len(items),
             "max_pairs_per_user": max_pairs_per_user or 0, "relevance": relevance,
             **{f"comparisons_dropped_{k}": int(v) for k, v in dropped.items()}}
    _warnings(stats, u, win, known_users, int(outside.sum()), (low, high), relevance_warning)
    return CollaborativeData(users=users, items=items, comparisons=comps,
                             path_comparisons=path_comps,
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


def make_comparisons(u, i, r, n_items: int, *, explicit=None, comparisons: str = "implicit",
                     implicit_per_item: int = 10, implicit_sampling: str = "uniform",
                     implicit_per_user: int = 0, implicit_min_rating: float = 0.0,
                     max_pairs_per_user: int | None = None,
                     seed: int = 0) -> tuple[np.ndarray, dict]:
    """Comparisons (user, winner, loser) of met rows ``(u, i, r)`` (NaN rating: an
    interaction), as :func:`collaborative` describes, and how many each kind dropped."""
    from solvers.pairs import implicit_comparisons, pairs_from_ratings

    made, dropped = [], {}
    if comparisons in ("explicit", "mixed"):
        rated = np.isfinite(r)
        pairs = pairs_from_ratings(u[rated], i[rated], r[rated],
                                   max_pairs_per_user=max_pairs_per_user, random_state=seed)
        dropped["explicit"] = _pairs_possible(u[rated], r[rated]) - len(pairs)
        made += [pairs] + ([explicit] if explicit is not None else [])
    if comparisons in ("implicit", "mixed"):
        wins = ~(r < implicit_min_rating)          # NaN (an interaction) wins
        imp = implicit_comparisons(u, i, max(n_items, 1), implicit_per_item, implicit_sampling,
                                   max_per_user=max_pairs_per_user, random_state=seed,
                                   positive=wins, per_user=implicit_per_user or None)
        asked = (np.count_nonzero(np.bincount(u[wins])) * implicit_per_user
                 if implicit_per_user else int(wins.sum()) * implicit_per_item)
        dropped["implicit"] = asked - len(imp)
        made.append(imp)
    return (np.concatenate(made) if made else np.zeros((0, 3), np.int64)), dropped


def _split(u, i, ts, split: str, holdout: int, fraction: float, min_train: int,
           seed: int) -> np.ndarray:
    """Row mask of a holdout: a stable random ``fraction``, or each user's latest rows."""
    if split == "random":
        return stable_split(u * (2**31) + i, fraction, seed)
    if holdout > 0:
        return holdout_latest(u, ts, holdout, min_train)
    return np.zeros(len(u), dtype=bool)


def _pairs_possible(users: np.ndarray, ratings: np.ndarray) -> int:
    """Within-user pairs with different ratings, over all users: Σ_u (n_u² − Σ_r n_ur²) / 2."""
    if len(users) == 0:
        return 0
    _, per_user = np.unique(users, return_counts=True)
    _, per_rating = np.unique(np.column_stack([users, ratings]), axis=0, return_counts=True)
    return int((np.sum(per_user.astype(np.int64) ** 2)
                - np.sum(per_rating.astype(np.int64) ** 2)) // 2)
