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
    """What a dataset was built from: a fixed snapshot of store offsets and the time range."""

    end_offsets: dict
    start_ts: int | None
    n_events: int
    min_ts: int | None = None
    max_ts: int | None = None

    def describe(self) -> dict:
        return {"end_offsets": {f"{t}/{p}": o for (t, p), o in sorted(self.end_offsets.items())},
                "start_ts": self.start_ts, "n_events": self.n_events,
                "min_ts": self.min_ts, "max_ts": self.max_ts}


@dataclass
class CollaborativeData:
    users: IdMap
    items: IdMap
    comparisons: np.ndarray           # (n, 3) int64: user, winner, loser (training)
    train: dict                       # user, item, rating of training ratings
    test: dict                        # user, item, rating of held-out ratings
    seen_indptr: np.ndarray           # CSR users x items of every rated item (to exclude)
    seen_indices: np.ndarray
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
                 int(ts_all.max()) if n else None)
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
                  fraction: float = 0.2, min_train: int = 5,
                  max_pairs_per_user: int | None = None, seed: int = 0) -> CollaborativeData:
    """AltSVM inputs from rating and/or comparison events.

    Ratings of a user become all within-user comparisons with different ratings (ties dropped,
    optionally capped per user). Held out for evaluation: with ``split="per_user_last"`` the
    ``holdout`` latest ratings of each user with at least ``holdout + min_train`` ratings
    (``holdout=0``: none); with ``split="random"`` a stable ``fraction`` of the (user, item)
    ratings, chosen by a hash of the pair and ``seed`` (a rating stays on its side as data
    grows). Explicit comparison events are all used for training.
    """
    from solvers import pairs_from_ratings

    columns = {"rating": ["ts", "offset", "user", "item", "rating"],
               "comparison": ["ts", "offset", "user", "winner", "loser"]}
    tables, win = _window_tables(store, kinds, window or {}, columns)
    users = users or IdMap()
    items = items or IdMap()
    empty = np.zeros(0, np.int64)
    r_user = r_item = empty
    r_rating = np.zeros(0)
    r_ts = empty
    if "rating" in tables and tables["rating"].num_rows:
        t = tables["rating"]
        users, r_user = _indices(users, t.column("user"))
        items, r_item = _indices(items, t.column("item"))
        keep = _latest_per_key(r_user * (2**31) + r_item, t.column("ts").to_numpy(),
                               t.column("offset").to_numpy())
        r_user, r_item = r_user[keep], r_item[keep]
        r_rating = t.column("rating").to_numpy()[keep]
        r_ts = t.column("ts").to_numpy()[keep]
    explicit = np.zeros((0, 3), np.int64)
    if "comparison" in tables and tables["comparison"].num_rows:
        t = tables["comparison"]
        users, c_user = _indices(users, t.column("user"))
        items, c_win = _indices(items, t.column("winner"))
        items, c_lose = _indices(items, t.column("loser"))
        explicit = np.column_stack([c_user, c_win, c_lose]).astype(np.int64)
    if split == "random":
        test = stable_split(r_user * (2**31) + r_item, fraction, seed)
    elif holdout > 0:
        test = _holdout_latest(r_user, r_ts, holdout, min_train)
    else:
        test = np.zeros(len(r_user), dtype=bool)
    train = ~test
    derived = pairs_from_ratings(r_user[train], r_item[train], r_rating[train],
                                 max_pairs_per_user=max_pairs_per_user, random_state=seed)
    possible = _pairs_possible(r_user[train], r_rating[train])
    comps = np.concatenate([derived, explicit])
    seen = r_user * (2**31) + r_item      # unique already: the latest rating per (user, item)
    if len(explicit):                     # explicit comparisons add their two items
        seen = np.unique(np.concatenate([seen, explicit[:, 0] * (2**31) + explicit[:, 1],
                                         explicit[:, 0] * (2**31) + explicit[:, 2]]))
    else:
        seen = np.sort(seen)
    seen_u, seen_i = seen // (2**31), seen % (2**31)
    indptr = np.r_[0, np.cumsum(np.bincount(seen_u, minlength=len(users)))]
    return CollaborativeData(
        users=users, items=items, comparisons=comps,
        train={"user": r_user[train], "item": r_item[train], "rating": r_rating[train]},
        test={"user": r_user[test], "item": r_item[test], "rating": r_rating[test]},
        seen_indptr=indptr, seen_indices=seen_i.astype(np.int64), window=win,
        stats={"ratings": int(len(r_user)), "comparisons": int(len(comps)),
               "test_ratings": int(test.sum()), "users": len(users), "items": len(items),
               "max_pairs_per_user": max_pairs_per_user or 0,
               "comparisons_dropped_by_cap": int(possible - len(derived))})


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
