"""Solver inputs from a window of the event store, vectorized (no per-event Python loops).

* :func:`collaborative` — rating and comparison events -> AltSVM comparisons (user, winner,
  loser) over stable indices, with a per-user holdout of each user's latest ratings.
* :func:`outcomes` — outcome events -> sparse (X, y) for TopPush, with a stable random split.
* :func:`ordinal` — ordinal events (reviews) -> ``[features | hashed text]`` rows and ratings
  for NPSVOR, one row per event, with a stable random split by event.
* :func:`judgments` — judgment events -> per-query (X, label) rows for kernel RankSVM, with
  whole queries held out by a stable hash.

Later events for the same (user, item) (or the same outcome item, or the same (query, doc))
replace earlier ones. Ids map to indices through :class:`pipeline.training.idmap.IdMap`s that
are extended, never renumbered, so factors and dual variables keep their meaning across
retrains.
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
    key: str = ""                     # what the window's keys are (users, items, queries)
    n_keys: int = 0                   # distinct keys kept, and stored
    n_keys_stored: int = 0

    @property
    def warning(self) -> str | None:
        """One line when the window drops more than half of the stored events or keys."""
        dropped_events = self.n_stored - self.n_events
        dropped_keys = self.n_keys_stored - self.n_keys
        if 2 * dropped_events <= self.n_stored and 2 * dropped_keys <= self.n_keys_stored:
            return None
        since = _iso(self.start_ts) if self.start_ts is not None else "the start"
        return (f"the window keeps {self.n_events:,} of {self.n_stored:,} stored events and "
                f"{self.n_keys:,} of {self.n_keys_stored:,} {self.key} (events since {since}): "
                f"the others get no model of their own; widen or drop the window "
                f"(window = {{}} keeps everything)")

    def describe(self) -> dict:
        out = {"end_offsets": {f"{t}/{p}": o for (t, p), o in sorted(self.end_offsets.items())},
               "start_ts": self.start_ts, "n_events": self.n_events,
               "n_dropped": self.n_stored - self.n_events,
               "min_ts": self.min_ts, "max_ts": self.max_ts}
        if self.key:
            out.update({self.key: self.n_keys, f"{self.key}_dropped":
                        self.n_keys_stored - self.n_keys})
        if self.warning:
            out["warning"] = self.warning
        return out


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


def _distinct(tables: dict, key: str) -> int:
    columns = [t.column(key).cast(pa.string()) for t in tables.values() if key in t.column_names]
    columns = [c for c in columns if len(c)]
    if not columns:
        return 0
    return int(pc.count_distinct(pa.chunked_array(
        [chunk for c in columns for chunk in c.chunks], pa.string())).as_py())


def _window_tables(store: EventStore, kinds, window: dict, columns: dict, key: str = ""):
    """Read ``kinds`` up to a fixed offset snapshot of their own segments (events of other
    kinds never move it), then apply ``last_days``/``last_events``; ``key`` names the column
    whose distinct values the window counts (kept and stored), for its warning."""
    end_offsets = store.next_offsets(kinds=kinds)
    tables = {k: store.read(k, end_offsets=end_offsets, columns=columns[k]) for k in kinds}
    ts_all = np.concatenate([t.column("ts").to_numpy() for t in tables.values()])
    n_stored = int(ts_all.size)
    keys_stored = _distinct(tables, key) if key else 0
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
    keys = keys_stored if start_ts is None else (_distinct(tables, key) if key else 0)
    win = Window(end_offsets, start_ts, n, int(ts_all.min()) if n else None,
                 int(ts_all.max()) if n else None, n_stored, key and f"{key}s", keys,
                 keys_stored)
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
    columns = {"rating": ["ts", "offset", "user", "item", "rating"],
               "interaction": ["ts", "offset", "user", "item"],
               "comparison": ["ts", "offset", "event_id", "user", "winner", "loser"]}
    known_users = 0 if users is None else len(users)
    tables, win = _window_tables(store, kinds, window or {}, columns, key="user")
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
        t = tables["comparison"]      # an event re-sent (or re-read from an edited file) once
        t = t.take(pa.array(_latest_per_key(event_ids(t.column("event_id")),
                                            t.column("ts").to_numpy(),
                                            t.column("offset").to_numpy())))
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
    outside = ~np.isnan(r) & ((r < low) | (r > high))
    if outside.any():       # before the latest is taken: the rating before a stray one counts
        u, i, r, ts, off = (a[~outside] for a in (u, i, r, ts, off))
    keep = _latest_per_key(u * (2**31) + i, ts, off)    # a rating after a view wins, ...
    u, i, r, ts = u[keep], i[keep], r[keep], ts[keep]
    relevance, relevance_warning = relevance_threshold(r, relevance)
    if implicit_min_rating == "relevance":
        implicit_min_rating = relevance
    part = np.full(len(u), TRAIN, np.int8)
    part[_split(u, i, ts, split, holdout, fraction, min_train, seed)] = TEST
    rest = np.flatnonzero(part == TRAIN)
    part[rest[_split(u[rest], i[rest], ts[rest], split, holdout, fraction, min_train,
                     seed + 1)]] = VALIDATION
    n_items = len(items)

    def build(rows) -> tuple[np.ndarray, dict]:
        return make_comparisons(u[rows], i[rows], r[rows], n_items, explicit=explicit,
                                comparisons=comparisons, implicit_per_item=implicit_per_item,
                                implicit_sampling=implicit_sampling,
                                implicit_per_user=implicit_per_user,
                                implicit_min_rating=implicit_min_rating,
                                max_pairs_per_user=max_pairs_per_user, seed=seed)

    train_rows = np.flatnonzero(part != TEST)
    comps, dropped = build(train_rows)
    path_comps, _ = build(np.flatnonzero(part == TRAIN))
    in_window = int(np.count_nonzero(np.bincount(u))) if len(u) else 0   # distinct users
    stats = {"met": int(len(u)), "ratings": int(np.isfinite(r).sum()),
             "interactions": int(np.isnan(r).sum()), "comparison_events": int(len(explicit)),
             "comparisons": int(len(comps)), "validation": int((part == VALIDATION).sum()),
             "test": int((part == TEST).sum()), "users": len(users), "items": n_items,
             "users_in_window": int(in_window), "max_pairs_per_user": max_pairs_per_user or 0,
             "relevance": relevance,
             **{f"comparisons_dropped_{k}": int(v) for k, v in dropped.items()}}
    if win.warning is None and known_users and in_window < 0.5 * known_users:
        stats["warning"] = (f"the window keeps {in_window:,} of the {known_users:,} users "
                            "seen before (events from "
                            f"{_iso(win.start_ts) if win.start_ts else 'the start'}); the "
                            "others get the fallback list: widen the window?")
    if outside.any():
        stats["ratings_out_of_range"] = int(outside.sum())
        relevance_warning = "; ".join(filter(None, [
            f"{int(outside.sum()):,} ratings are outside {low:g}..{high:g} "
            "(params.rating_range): left out", relevance_warning]))
    if relevance_warning:
        stats["warning"] = "; ".join(filter(None, [stats.get("warning"), relevance_warning]))
    return CollaborativeData(users=users, items=items, comparisons=comps,
                             path_comparisons=path_comps,
                             met={"user": u, "item": i, "rating": r, "part": part},
                             window=win, stats=stats)


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
    tables, win = _window_tables(store, ["outcome"], window or {}, columns, key="item")
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


@dataclass
class OrdinalData:
    """NPSVOR's inputs: one row per review (ordinal event), ``[features | hashed text]``.

    ``ids`` are the rows' stable instance ids (:func:`event_ids`), which key the duals for warm
    starts; ``latest`` holds, for every item in the window, the row of its latest event: the
    row whose prediction is published as the item's rating."""

    X: object                         # scipy.sparse.csr_matrix float32 (rows, n_features + text)
    y: np.ndarray                     # int64 ratings
    ids: np.ndarray                   # int64 stable instance id of each row
    item_ids: np.ndarray              # str, the items of the window
    row_item: np.ndarray              # index into item_ids of each row
    latest: np.ndarray                # row of each item's latest event, in item_ids order
    test_mask: np.ndarray
    n_features: int                   # numeric feature columns; text starts after them
    text_features: int
    window: Window
    stats: dict = field(default_factory=dict)


def event_ids(column) -> np.ndarray:
    """Stable 63-bit instance ids of event ids: the first 8 bytes of BLAKE2b of the UTF-8 id.

    The same in every process and release (Python's ``hash`` is salted per process), 8 bytes a
    row whatever the id's length, and no id map to keep: two distinct event ids share one with
    probability about n² / 2**64 (5e-8 for a million events).

    >>> event_ids(pa.array(["r1", "r2", "r1"])).tolist()[0] == event_ids(["r1"]).tolist()[0]
    True
    """
    from hashlib import blake2b

    values = column.to_pylist() if hasattr(column, "to_pylist") else list(column)
    return np.fromiter((int.from_bytes(blake2b(str(v).encode(), digest_size=8).digest(),
                                       "little") >> 1 for v in values),
                       dtype=np.int64, count=len(values))


def ordinal(store: EventStore, *, window=None, test_fraction: float = 0.2, seed: int = 0,
            n_features: int | None = None, max_features: int = 2**20,
            text_features: int = 2**20, levels: int = 10) -> OrdinalData:
    """NPSVOR inputs from ordinal events (reviews: item, label, features and/or text).

    One row per event, not per item: an item may have many reviews, each a training instance
    with its own rating. An event re-sent with the same ``event_id`` counts once (the latest by
    ts, then offset). Rows are :func:`pipeline.features.feature_rows` of the events, the same
    function the lookup uses on a request: numeric features in columns ``0..n_features-1``
    (the highest index + 1, at least ``n_features``, the previous run's, so it never shrinks,
    and at most ``max_features``; values of a higher index are left out and counted), then
    ``text_features`` columns of hashed uni- and bigrams (0: text is ignored).

    The held-out split is by event, by a stable hash of its instance id, so an event stays on
    its side as data grows. The item's published rating is the prediction for its *latest*
    event's features and text (what the item looks like now), not an average over its reviews.

    Labels outside ``1..levels`` are left out and counted (``stats["labels_out_of_range"]``,
    with a warning): one stray label (1e9) must neither size an allocation nor stop every
    retrain while it stays in the window.
    """
    from pipeline.features import feature_rows

    columns = {"ordinal": ["ts", "offset", "event_id", "item", "label", "feature_index",
                           "feature_value", "text"]}
    tables, win = _window_tables(store, ["ordinal"], window or {}, columns, key="item")
    t = tables["ordinal"]
    ids = event_ids(t.column("event_id"))
    keep = _latest_per_key(ids, t.column("ts").to_numpy(), t.column("offset").to_numpy())
    t, ids = t.take(pa.array(keep)), ids[keep]
    label = t.column("label").to_numpy()
    in_range = (label >= 1) & (label <= int(levels))
    out_of_range = int((~in_range).sum())
    if out_of_range:
        t, ids = t.filter(pa.array(in_range)), ids[in_range]
    lengths = pc.fill_null(pc.list_value_length(t.column("feature_index")), 0)
    top = pc.max(pc.list_flatten(t.column("feature_index"))).as_py() if t.num_rows else None
    width = min(max(0 if top is None else top + 1, n_features or 0), int(max_features))
    X, dropped = feature_rows(t.column("feature_index").to_pylist(),
                              t.column("feature_value").to_pylist(), width,
                              t.column("text").to_pylist() if text_features else None,
                              int(text_features))
    codes, uniques = id_codes(t.column("item"))
    item_of_row = codes.astype(np.int64)
    latest = _latest_per_key(item_of_row, t.column("ts").to_numpy(),
                             t.column("offset").to_numpy())
    latest = latest[np.argsort(item_of_row[latest], kind="stable")]
    y = t.column("label").to_numpy().astype(np.int64)
    test = stable_split(ids, test_fraction, seed) if test_fraction > 0 else \
        np.zeros(len(ids), bool)
    labels, counts = np.unique(y, return_counts=True)
    with_text = int(pc.sum(pc.invert(pc.is_null(t.column("text")))).as_py() or 0)
    stats = {"reviews": int(len(y)), "resent": int(win.n_events - len(y)),
             "items": int(len(uniques)), "test": int(test.sum()),
             "labels": {int(k): int(c) for k, c in zip(labels, counts)},
             "with_text": with_text,
             "with_features": int(pc.sum(pc.greater(lengths, 0)).as_py() or 0),
             "features": width, "text_features": int(text_features),
             "feature_values_over_max_features": dropped,
             "empty_rows": int((np.diff(X.indptr) == 0).sum())}
    warnings = []
    if with_text and not text_features:
        warnings.append(f"{with_text:,} events carry text, but text_features is 0: their "
                        "text is ignored")
    if out_of_range:
        stats["labels_out_of_range"] = out_of_range
        warnings.append(f"{out_of_range:,} events have a label outside 1..{levels} "
                        "(params.levels): left out")
    if warnings:
        stats["warning"] = "; ".join(warnings)
    return OrdinalData(X=X, y=y, ids=ids, item_ids=uniques.astype(str), row_item=item_of_row,
                       latest=latest, test_mask=test, n_features=width,
                       text_features=int(text_features), window=win, stats=stats)


@dataclass
class JudgmentData:
    """Kernel RankSVM's inputs: one row per judged (query, doc), the latest judgment of it.

    ``instance`` is the row's stable instance id ``query index · 2**32 + doc index`` (indices of
    the extended-never-renumbered id maps), which keys β for warm starts; ``test_mask`` marks
    the rows of held-out queries."""

    queries: IdMap
    docs: IdMap
    X: object                         # scipy.sparse.csr_matrix (rows, n_features)
    label: np.ndarray                 # int32 relevance grades >= 0
    query: np.ndarray                 # query index of each row
    doc: np.ndarray                   # doc index of each row
    instance: np.ndarray              # int64 stable instance id
    test_mask: np.ndarray
    window: Window
    stats: dict = field(default_factory=dict)


def instance_ids(query: np.ndarray, doc: np.ndarray) -> np.ndarray:
    """Stable id of a (query index, doc index) pair: ``query · 2**32 + doc`` (int64).

    >>> instance_ids(np.array([0, 2]), np.array([5, 1])).tolist()
    [5, 8589934593]
    """
    return query.astype(np.int64) * np.int64(2**32) + doc.astype(np.int64)


def judgments(store: EventStore, *, window=None, queries: IdMap | None = None,
              docs: IdMap | None = None, test_fraction: float = 0.2, seed: int = 0,
              n_features: int | None = None, max_features: int = 1024) -> JudgmentData:
    """Kernel RankSVM inputs from judgment events.

    One row per (query, doc): a judgment re-sent for the same pair replaces the earlier one
    (the latest by ts, then offset, wins; ``stats["replaced"]`` counts them). The held-out
    split is by *query*: a stable hash of the query index puts a ``test_fraction`` of the
    queries, with all their docs, in the test set, so a query stays on its side as data grows
    and the evaluation measures ranking for queries the model never saw.

    Features are the events' (sparse or dense) features; the width is the highest index + 1,
    at least ``n_features`` (the previous run's, so the width never shrinks) and at most
    ``max_features``: feature values of a higher index are left out and counted (the kernel
    works on dense rows, so a stray index 10**6 must not make X 10**6 wide).
    """
    columns = {"judgment": ["ts", "offset", "query", "doc", "label", "feature_index",
                            "feature_value"]}
    tables, win = _window_tables(store, ["judgment"], window or {}, columns, key="query")
    t = tables["judgment"]
    queries, q = _indices(queries or IdMap(), t.column("query"))
    docs, d = _indices(docs or IdMap(), t.column("doc"))
    instance = instance_ids(q, d)
    keep = _latest_per_key(instance, t.column("ts").to_numpy(), t.column("offset").to_numpy())
    t = t.take(pa.array(keep))
    X = features_csr(t, max_features=max_features)
    stored = int(pc.sum(pc.list_value_length(t.column("feature_index"))).as_py() or 0)
    width = min(max(X.shape[1], n_features or 0), max_features)
    if X.shape[1] < width:
        X.resize((X.shape[0], width))
    label = t.column("label").to_numpy().astype(np.int32)
    q, d, instance = q[keep], d[keep], instance[keep]
    test = stable_split(q, test_fraction, seed) if test_fraction > 0 else \
        np.zeros(len(q), bool)
    stats = {"judgments": int(len(q)), "replaced": int(win.n_events - len(q)),
             "queries": int(np.unique(q).size), "test_queries": int(np.unique(q[test]).size),
             "docs": int(np.unique(d).size), "test": int(test.sum()),
             "train_queries_with_pairs": queries_with_pairs(q[~test], label[~test]),
             "features": int(X.shape[1]), "feature_values_over_max_features": stored - X.nnz}
    return JudgmentData(queries=queries, docs=docs, X=X.tocsr(), label=label, query=q, doc=d,
                        instance=instance, test_mask=test, window=win, stats=stats)


def queries_with_pairs(query: np.ndarray, label: np.ndarray) -> int:
    """How many queries have two docs with different labels (at least one preference pair).

    >>> queries_with_pairs(np.array([0, 0, 1, 1, 2]), np.array([1, 0, 2, 2, 1]))
    1
    """
    if len(query) == 0:
        return 0
    pairs = np.unique(np.column_stack([query, label]), axis=0)
    _, levels = np.unique(pairs[:, 0], return_counts=True)
    return int((levels >= 2).sum())
