"""Solver inputs from a window of the event store, vectorized (no per-event Python loops).

* :func:`collaborative` — rating and comparison events -> AltSVM comparisons (user, winner,
  loser) over stable indices, with a per-user holdout of each user's latest ratings.
* :func:`outcomes` — outcome events -> sparse (X, y) for TopPush, with a stable random split.

Later events for the same (user, item) (or the same outcome item) replace earlier ones. Ids map
to indices through :class:`pipeline.training.idmap.IdMap`s that are extended, never
renumbered, so factors and dual variables keep their meaning across retrains.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from pipeline.ingest.store import EventStore
from pipeline.training.arrays import features_csr, id_codes
from pipeline.training.idmap import IdMap

DAY_MS = 86_400_000


@dataclass
class Window:
    """What a dataset was built from: a fixed snapshot of store offsets, the time range, and
    how many of the stored events the window kept (``last_days`` counts back from the newest
    event, so on data spanning years it can keep a sliver: the report says so)."""

    end_offsets: dict
    start_ts: int | None
    n_events: int
    min_ts: int | None = None
    max_ts: int | None = None
    n_stored: int = 0

    def describe(self) -> dict:
        return {"end_offsets": {f"{t}/{p}": o for (t, p), o in sorted(self.end_offsets.items())},
                "start_ts": self.start_ts, "n_events": self.n_events,
                "n_dropped": self.n_stored - self.n_events,
                "min_ts": self.min_ts, "max_ts": self.max_ts}


def _iso(ms: int) -> str:
    from datetime import datetime, timezone

    return datetime.fromtimestamp(ms / 1000, tz=timezone.utc).date().isoformat()


TRAIN, VALIDATION, TEST = 0, 1, 2      # the part of the data a (user, item) row is in


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


@dataclass
class OutcomeData:
    items: IdMap
    X: object                         # scipy.sparse.csr_matrix, rows = items in ``rows``
    y: np.ndarray                     # 0/1
    rows: np.ndarray                  # item index of each row
    test_mask: np.ndarray
    window: Window
    stats: dict = field(default_factory=dict)


def _window_tables(store: EventStore, kinds, window: dict, columns: dict):
    """Read ``kinds`` up to a fixed offset snapshot of their own segments (events of other
    kinds never move it), then apply ``last_days``/``last_events``."""
    end_offsets = store.next_offsets(kinds=kinds)
    tables = {k: store.read(k, end_offsets=end_offsets, columns=columns[k]) for k in kinds}
    ts_all = np.concatenate([t.column("ts").to_numpy() for t in tables.values()])
    n_stored = int(ts_all.size)
    start_ts = None
    if ts_all.size and "last_days" in window:
        start_ts = int(ts_all.max() - window["last_days"] * DAY_MS)
    elif ts_all.size and "last_events" in window and ts_all.size > window["last_events"]:
        start_ts = int(np.partition(ts_all, -int(window["last_events"]))
                       [-int(window["last_events"])])
    if start_ts is not None:
        tables = {k: t.filter(pc.greater_equal(t.column("ts"), start_ts))
                  for k, t in tables.items()}
        ts_all = ts_all[ts_all >= start_ts]
    n = int(sum(t.num_rows for t in tables.values()))
    win = Window(end_offsets, start_ts, n, int(ts_all.min()) if n else None,
                 int(ts_all.max()) if n else None, n_stored)
    return tables, win


def _indices(idmap: IdMap, column) -> tuple[IdMap, np.ndarray]:
    """Extend ``idmap`` with the ids of an Arrow column; return it and each row's index."""
    codes, uniques = id_codes(column)
    idmap, unique_idx = idmap.extend(uniques.astype(str))
    return idmap, unique_idx[codes] if len(codes) else np.zeros(0, np.int64)


def _latest_per_key(keys: np.ndarray, ts: np.ndarray, offset: np.ndarray) -> np.ndarray:
    """Row positions of the latest event per key (by ts, then offset)."""
    order = np.lexsort((offset, ts, keys))
    last = np.ones(len(order), dtype=bool)
    last[:-1] = keys[order][1:] != keys[order][:-1]
    return np.sort(order[last])


def _holdout_latest(users: np.ndarray, ts: np.ndarray, holdout: int, min_train: int):
    """Mask of each user's ``holdout`` latest rows, for users with >= holdout + min_train rows."""
    order = np.lexsort((-ts, users))
    su = users[order]
    starts = np.flatnonzero(np.r_[True, su[1:] != su[:-1]])
    counts = np.diff(np.r_[starts, len(su)])
    rank = np.arange(len(su)) - np.repeat(starts, counts)
    eligible = np.repeat(counts >= holdout + min_train, counts)
    mask = np.zeros(len(users), dtype=bool)
    mask[order[(rank < holdout) & eligible]] = True
    return mask


def collaborative(store: EventStore, kinds=("rating",), *, window=None, users: IdMap | None = None,
                  items: IdMap | None = None, split: str = "per_user_last", holdout: int = 5,
                  fraction: float = 0.2, min_train: int = 5, comparisons: str = "implicit",
                  implicit_per_item: int = 10, implicit_sampling: str = "uniform",
                  max_pairs_per_user: int | None = None, seed: int = 0) -> CollaborativeData:
    """AltSVM inputs from rating, interaction and comparison events.

    Every (user, item) a user met (rated or interacted with; the latest event wins) is a
    ``met`` row. Held out for evaluation (TEST): with ``split="per_user_last"`` the
    ``holdout`` latest rows of each user with at least ``holdout + min_train`` of them; with
    ``split="random"`` a stable ``fraction`` chosen by a hash of (user, item, seed), so a row
    stays on its side as data grows. VALIDATION is carved out of the rest the same way (seed
    + 1), for choosing λ on the regularization path.

    Comparisons (``comparisons``): ``"explicit"``, within-user pairs of TRAIN ratings with
    different ratings (plus comparison events); ``"implicit"``, "the user met item i, so i
    beats a sampled item the user never met", ``implicit_per_item`` per met row
    (:func:`solvers.pairs.implicit_comparisons`, ``implicit_sampling`` uniform or by
    popularity); ``"mixed"``, both. ``max_pairs_per_user`` caps each kind per user, by a
    stable hash, and the stats say how many were dropped.
    """
    from solvers.pairs import implicit_comparisons, pairs_from_ratings

    columns = {"rating": ["ts", "offset", "user", "item", "rating"],
               "interaction": ["ts", "offset", "user", "item"],
               "comparison": ["ts", "offset", "user", "winner", "loser"]}
    known_users = 0 if users is None else len(users)
    tables, win = _window_tables(store, kinds, window or {}, columns)
    users, items = users or IdMap(), items or IdMap()
    parts = []   # (user, item, rating, ts, offset) per met event
    for kind in ("rating", "interaction"):
        t = tables.get(kind)
        if t is None or not t.num_rows:
            continue
        users, u = _indices(users, t.column("user"))
        items, i = _indices(items, t.column("item"))
        r = t.column("rating").to_numpy() if kind == "rating" else np.full(len(u), np.nan)
        parts.append((u, i, r, t.column("ts").to_numpy(), t.column("offset").to_numpy()))
    explicit = np.zeros((0, 3), np.int64)
    if "comparison" in tables and tables["comparison"].num_rows:
        t = tables["comparison"]
        users, c_user = _indices(users, t.column("user"))
        items, c_win = _indices(items, t.column("winner"))
        items, c_lose = _indices(items, t.column("loser"))
        explicit = np.column_stack([c_user, c_win, c_lose]).astype(np.int64)
    if parts:
        u, i, r, ts, off = (np.concatenate(column) for column in zip(*parts))
    else:
        u = i = ts = off = np.zeros(0, np.int64)
        r = np.zeros(0)
    u, i = u.astype(np.int64), i.astype(np.int64)
    keep = _latest_per_key(u * (2**31) + i, ts, off)    # a rating after a view wins, ...
    u, i, r, ts = u[keep], i[keep], r[keep], ts[keep]
    part = np.full(len(u), TRAIN, np.int8)
    part[_split(u, i, ts, split, holdout, fraction, min_train, seed)] = TEST
    rest = np.flatnonzero(part == TRAIN)
    part[rest[_split(u[rest], i[rest], ts[rest], split, holdout, fraction, min_train,
                     seed + 1)]] = VALIDATION
    n_items = len(items)

    def build(rows) -> tuple[np.ndarray, dict]:
        made, dropped = [], {}
        if comparisons in ("explicit", "mixed"):
            rated = rows[np.isfinite(r[rows])]
            pairs = pairs_from_ratings(u[rated], i[rated], r[rated],
                                       max_pairs_per_user=max_pairs_per_user, random_state=seed)
            dropped["explicit"] = _pairs_possible(u[rated], r[rated]) - len(pairs)
            made += [pairs, explicit]
        if comparisons in ("implicit", "mixed"):
            imp = implicit_comparisons(u[rows], i[rows], max(n_items, 1), implicit_per_item,
                                       implicit_sampling, max_per_user=max_pairs_per_user,
                                       random_state=seed)
            dropped["implicit"] = len(rows) * implicit_per_item - len(imp)
            made.append(imp)
        return (np.concatenate(made) if made else np.zeros((0, 3), np.int64)), dropped

    train_rows = np.flatnonzero(part != TEST)
    comps, dropped = build(train_rows)
    path_comps, _ = build(np.flatnonzero(part == TRAIN))
    in_window = np.unique(u).size
    stats = {"met": int(len(u)), "ratings": int(np.isfinite(r).sum()),
             "interactions": int(np.isnan(r).sum()), "comparison_events": int(len(explicit)),
             "comparisons": int(len(comps)), "validation": int((part == VALIDATION).sum()),
             "test": int((part == TEST).sum()), "users": len(users), "items": n_items,
             "users_in_window": int(in_window), "max_pairs_per_user": max_pairs_per_user or 0,
             **{f"comparisons_dropped_{k}": int(v) for k, v in dropped.items()}}
    if known_users and in_window < 0.5 * known_users:
        stats["warning"] = (f"the window keeps {in_window:,} of the {known_users:,} users "
                            "seen before (events from "
                            f"{_iso(win.start_ts) if win.start_ts else 'the start'}); the "
                            "others get the fallback list: widen the window?")
    return CollaborativeData(users=users, items=items, comparisons=comps,
                             path_comparisons=path_comps,
                             met={"user": u, "item": i, "rating": r, "part": part},
                             window=win, stats=stats)


def _split(u, i, ts, split: str, holdout: int, fraction: float, min_train: int,
           seed: int) -> np.ndarray:
    """Row mask of a holdout: a stable random ``fraction``, or each user's latest rows."""
    if split == "random":
        return stable_split(u * (2**31) + i, fraction, seed)
    if holdout > 0:
        return _holdout_latest(u, ts, holdout, min_train)
    return np.zeros(len(u), dtype=bool)


def _pairs_possible(users: np.ndarray, ratings: np.ndarray) -> int:
    """Within-user pairs with different ratings, over all users: Σ_u (n_u² − Σ_r n_ur²) / 2."""
    if len(users) == 0:
        return 0
    _, per_user = np.unique(users, return_counts=True)
    _, per_rating = np.unique(np.column_stack([users, ratings]), axis=0, return_counts=True)
    return int((np.sum(per_user.astype(np.int64) ** 2)
                - np.sum(per_rating.astype(np.int64) ** 2)) // 2)


def stable_split(index: np.ndarray, fraction: float, seed: int = 0) -> np.ndarray:
    """Test mask from a hash of the stable index: an instance stays on its side across runs."""
    h = (index.astype(np.uint64) + np.uint64(seed)) * np.uint64(0x9E3779B97F4A7C15)
    return (h >> np.uint64(40)).astype(np.float64) / float(1 << 24) < fraction


def outcomes(store: EventStore, *, window=None, items: IdMap | None = None,
             test_fraction: float = 0.2, seed: int = 0, n_features: int | None = None,
             max_features: int = 2**24) -> OutcomeData:
    """TopPush inputs from outcome events: one row per item (its latest outcome). Features of
    index ``max_features`` or more are left out (counted in the stats), so no single event can
    make the model's weight vector arbitrarily large."""
    columns = {"outcome": ["ts", "offset", "item", "label", "feature_index", "feature_value"]}
    tables, win = _window_tables(store, ["outcome"], window or {}, columns)
    t = tables["outcome"]
    items, idx = _indices(items or IdMap(), t.column("item"))
    keep = _latest_per_key(idx, t.column("ts").to_numpy(), t.column("offset").to_numpy())
    t = t.take(pa.array(keep))
    X = features_csr(t, max_features=max_features)
    dropped = int(pc.sum(pc.list_value_length(t.column("feature_index"))).as_py() or 0) - X.nnz
    if n_features is not None and X.shape[1] < n_features:
        X.resize((X.shape[0], n_features))
    y = t.column("label").to_numpy().astype(np.int8)
    rows = idx[keep]
    test = stable_split(rows, test_fraction, seed) if test_fraction > 0 else \
        np.zeros(len(rows), bool)
    return OutcomeData(items=items, X=X, y=y, rows=rows, test_mask=test, window=win,
                       stats={"outcomes": int(len(rows)), "positives": int(y.sum()),
                              "test": int(test.sum()), "features": int(X.shape[1]),
                              "feature_values_over_max_features": dropped})
