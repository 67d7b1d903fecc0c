"""The machinery the families' dataset builders share, vectorized (no per-event Python loops):
a window of the event store read up to a fixed offset snapshot (:func:`window_tables`), stable
id maps (:func:`id_indices`), the latest event per key (:func:`latest_per_key`), and stable
holdouts (:func:`stable_split`, :func:`holdout_latest`).

Each family's builder lives with its trainer:

* :func:`pipeline.training.trainers.altsvm_data.collaborative` — rating and comparison events
  -> AltSVM comparisons (user, winner, loser) over stable indices, with a per-user holdout of
  each user's latest ratings.
* :func:`pipeline.training.trainers.toppush.outcomes` — outcome events -> sparse (X, y) for
  TopPush, with a stable random split.
* :func:`pipeline.training.trainers.npsvor_data.ordinal` — ordinal events (reviews) ->
  ``[features | hashed text]`` rows and ratings for NPSVOR, one row per event, with a stable
  random split by event.
* :func:`pipeline.training.trainers.kernel_ranksvm.judgments` — judgment events -> per-query
  (X, label) rows for kernel RankSVM, with whole queries held out by a stable hash.

Later events for the same (user, item) (or the same outcome item, or the same (query, doc))
replace earlier ones. Ids map to indices through :class:`pipeline.training.idmap.IdMap`s that
are extended, never renumbered, so factors and dual variables keep their meaning across
retrains.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from pipeline.ingest.store import EventStore
from pipeline.training.arrays import id_codes
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
        since = iso_date(self.start_ts) if self.start_ts is not None else "the start"
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


def iso_date(ms: int) -> str:
    """The UTC date of a timestamp in ms, ``YYYY-MM-DD``.

    >>> iso_date(1_700_000_000_000)
    '2023-11-14'
    """
    from datetime import datetime, timezone

    return datetime.fromtimestamp(ms / 1000, tz=timezone.utc).date().isoformat()


TRAIN, VALIDATION, TEST = 0, 1, 2      # the part of the data a (user, item) row is in


def _distinct(tables: dict, key: str) -> int:
    columns = [t.column(key).cast(pa.string()) for t in tables.values() if key in t.column_names]
    columns = [c for c in columns if len(c)]
    if not columns:
        return 0
    return int(pc.count_distinct(pa.chunked_array(
        [chunk for c in columns for chunk in c.chunks], pa.string())).as_py())


def window_tables(store: EventStore, kinds, window: dict, columns: dict, key: str = ""):
    """Read ``kinds`` up to a fixed offset snapshot of their own segments (events of other
    kinds never move it), then apply ``last_days``/``last_events``; ``key`` names the column
    whose distinct values the window counts (kept and stored), for its warning."""
    end_offsets = store.next_offsets(kinds=kinds)
    tables = {k: store.read(k, end_offsets=end_offsets, columns=columns[k]) for k in kinds}
    ts_all = np.concatenate([t.column("ts").to_numpy() for t in tables.values()])
    n_stored = int(ts_all.size)
    keys_stored = _distinct(tables, key) if key else 0
    start_ts = window_start(ts_all, window)
    if start_ts is not None:
        tables = {k: t.filter(pc.greater_equal(t.column("ts"), start_ts))
                  for k, t in tables.items()}
        ts_all = ts_all[ts_all >= start_ts]
    n = int(sum(t.num_rows for t in tables.values()))
    keys = keys_stored if start_ts is None else (_distinct(tables, key) if key else 0)
    win = Window(end_offsets, start_ts, n, int(ts_all.min()) if n else None,
                 int(ts_all.max()) if n else None, n_stored, plural(key), keys,
                 keys_stored)
    return tables, win


def window_start(ts: np.ndarray, window: dict) -> int | None:
    """The first time (ms) a window keeps of events at times ``ts`` (every kind's), or None
    for all of them: ``last_days`` back from the newest, or the ``last_events``-th newest time
    (ties at it kept). The refresher applies the same to a user's history.

    >>> window_start(np.array([0, 5 * DAY_MS, 9 * DAY_MS]), {"last_days": 7})
    172800000
    >>> window_start(np.array([3, 1, 2]), {"last_events": 2}), window_start(np.array([3]), {})
    (2, None)
    """
    if ts.size and "last_days" in window:
        return int(ts.max() - window["last_days"] * DAY_MS)
    if ts.size and "last_events" in window and ts.size > window["last_events"]:
        return int(np.partition(ts, -int(window["last_events"]))[-int(window["last_events"])])
    return None


def plural(noun: str) -> str:
    """``"queries"`` of ``"query"``, ``"users"`` of ``"user"`` ("" stays "").

    >>> plural("query"), plural("user"), plural("")
    ('queries', 'users', '')
    """
    if noun.endswith("y") and noun[-2:-1] not in "aeiou":
        return noun[:-1] + "ies"
    return noun + "s" if noun else ""


def id_indices(idmap: IdMap, column) -> tuple[IdMap, np.ndarray]:
    """Extend ``idmap`` with the ids of an Arrow column; return it and each row's index."""
    codes, uniques = id_codes(column)
    idmap, unique_idx = idmap.extend(uniques.astype(str))
    return idmap, unique_idx[codes] if len(codes) else np.zeros(0, np.int64)


def latest_per_key(keys: np.ndarray, ts: np.ndarray, offset: np.ndarray) -> np.ndarray:
    """Row positions of the latest event per key (by ts, then offset)."""
    order = np.lexsort((offset, ts, keys))
    last = np.ones(len(order), dtype=bool)
    last[:-1] = keys[order][1:] != keys[order][:-1]
    return np.sort(order[last])


def holdout_latest(users: np.ndarray, ts: np.ndarray, holdout: int, min_train: int):
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


def stable_split(index: np.ndarray, fraction: float, seed: int = 0) -> np.ndarray:
    """Test mask from a hash of the stable index: an instance stays on its side across runs.

    The hash is SplitMix64's finalizer of ``index + seed·φ`` (every bit of the index moves
    every bit of the result). A bare multiplicative hash ``(index + seed)·φ`` is not enough:
    for ``index = user·2³¹ + item`` its top bits are ``frac(a_user + b_item)``, so each user
    holds out a band of items and the split of one seed is the other's shifted; on MovieLens
    100K a validation split made that way scored 24 ALS settings with a correlation of 0.07
    to their held-out scores (0.99 with this hash).

    >>> m = stable_split(np.arange(100_000), 0.2, 3)
    >>> round(float(m.mean()), 2), bool((m == stable_split(np.arange(100_000), 0.2, 3)).all())
    (0.2, True)
    """
    from solvers._random import GOLDEN, mix64

    with np.errstate(over="ignore"):
        z = mix64(np.asarray(index).astype(np.uint64) + np.uint64(seed) * GOLDEN - GOLDEN)
    return (z >> np.uint64(40)).astype(np.float64) / float(1 << 24) < fraction


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

