"""Each user's history for the refresher, kept as what it comes to: per user, one row per item
(the latest in-scale rating or interaction) and one entry per comparison event id (its latest
copy), by the rules of :mod:`pipeline.refresh.events` (training's), whose plain-list reference
:func:`~pipeline.refresh.events.fold_in_inputs` it equals (``tests/refresh/test_history.py``).

Both are maxima by (ts, offset) (training's :func:`~pipeline.training.datasets.latest_per_key`),
so folding an event in twice changes nothing and the order events come in does not matter:
what the stream brings is folded into a user's rows when they are next read (once per batch,
not per poll), and what the event store holds is folded in again at each version
(:meth:`UserHistory.load_store`), where the stream's copies already are.
The window is applied when the inputs are read, not when events are folded: the latest event
of an item is in the window exactly when some event of it is, and that one is the latest in it.

Memory is what a user's events come to, not the events: a row is 28 bytes (``RATED``). Until
the store holds them, the streamed events leave one largest offset per (Kafka partition, user)
(:class:`LatestOffsets`: whom the next version replays), and, under a ``last_events`` window
only, each event's offset and time (16 bytes: the window counts every event). A refresher fed
2,000 events/s holds its users' distinct items, not every event since the last retrain; with
several refreshers, only its own users' (:mod:`pipeline.refresh.ownership`, the ``keep`` of
:meth:`UserHistory.load_store` and :meth:`UserHistory.forget`).
"""

from __future__ import annotations

import math

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from pipeline.refresh.events import USER_KINDS, FoldInInputs, bounds_of, inputs_from
from pipeline.serving.layout import key_of
from pipeline.training.datasets import latest_per_key, window_start
from pipeline.training.trainers.altsvm_data import COLUMNS

# one row per (user, item): the latest in-scale rating (NaN: an interaction) at (ts, offset)
RATED = np.dtype([("code", np.int32), ("rating", np.float64), ("ts", np.int64),
                  ("offset", np.int64)], align=False)


class LatestOffsets:
    """Per user code, the largest offset streamed from one source: batches are appended and
    folded into one row per user once they outnumber the rows held (amortized O(1) a row;
    memory at most twice the users', however many events came).

    >>> log = LatestOffsets()
    >>> log.add(np.array([3, 1, 3], np.int32), np.array([7, 8, 9]))
    >>> log.add(np.array([1], np.int32), np.array([2]))
    >>> [a.tolist() for a in log.rows()]
    [[1, 3], [8, 9]]
    """

    def __init__(self):
        self.codes, self.offsets = np.zeros(0, np.int32), np.zeros(0, np.int64)
        self.batches: list = []
        self.waiting = 0

    def add(self, codes: np.ndarray, offsets: np.ndarray) -> None:
        self.batches.append((codes, offsets))
        self.waiting += len(codes)
        if self.waiting > max(4096, len(self.codes)):
            self.rows()

    def rows(self) -> tuple[np.ndarray, np.ndarray]:
        """(user codes, each one's largest offset), by code."""
        if self.batches:
            codes = np.concatenate([self.codes] + [c for c, _ in self.batches])
            offsets = np.concatenate([self.offsets] + [o for _, o in self.batches])
            order = np.lexsort((offsets, codes))        # by code, the largest offset last
            last = np.r_[codes[order][1:] != codes[order][:-1], True]
            self.codes, self.offsets = codes[order][last], offsets[order][last]
            self.batches, self.waiting = [], 0
        return self.codes, self.offsets

    def keep(self, mask: np.ndarray) -> None:
        self.codes, self.offsets = self.codes[mask], self.offsets[mask]


class UserHistory:
    """Every user's events, folded (see the module), under ratings ``bounds`` (low, high), for
    a model whose window is ``window`` (training's: ``{}``, ``last_days`` or ``last_events``)."""

    def __init__(self, bounds: tuple[float, float] = (-math.inf, math.inf),
                 window: dict | None = None):
        self.bounds, self.window = bounds, dict(window or {})
        self.codes: dict = {}                       # item id -> code
        self.items: list = []                       # code -> item id
        self.rated: dict[str, np.ndarray] = {}      # user -> RATED rows, by code
        self.arrived: dict[str, list] = {}          # user -> RATED rows not folded in yet
        self.compared: dict[str, dict] = {}         # user -> event id -> (key, (w, l) codes)
        self.unstored: dict = {}        # source -> LatestOffsets of what the store lacks
        self.unstored_times: list = []  # (source, offsets, ts) per batch: last_events only
        self.user_code: dict = {}       # user key -> code, for the log (one str per user)
        self.user_keys: list = []       # code -> user key
        self.stored_ts = np.zeros(0, np.int64)      # every stored event's time, for the window
        self.newest: int | None = None              # the newest time held
        self.unstored_newest: int | None = None     # ... of the streamed events
        self.last_start: tuple | None = None        # (last_events' start, arrivals since)
        self.index_token, self.index = None, np.zeros(0, np.int64)   # code -> version index

    def use_bounds(self, bounds: tuple[float, float]) -> bool:
        """Fold ratings under ``bounds`` from now on; True when they changed, and what was
        folded is dropped (ratings outside a scale are left out before the latest is taken):
        the caller reads the store again, and events streamed since that it does not hold yet
        count from the next version on."""
        if tuple(bounds) == tuple(self.bounds):
            return False
        self.bounds, self.rated, self.arrived = tuple(bounds), {}, {}
        self.unstored, self.unstored_times, self.unstored_newest = {}, [], None
        return True

    def load_store(self, store, kinds, keep=None) -> int:
        """Fold in every event of the model's kinds the event store holds (``keep``: of the
        users it keeps, a function of user keys to a mask; None: of every user); the number
        of stored events (a ``last_events`` window counts them all, kept or not)."""
        times = []
        for kind in kinds:
            if kind in USER_KINDS:
                table = store.read(kind, columns=COLUMNS[kind])
                times.append(table.column("ts").to_numpy().astype(np.int64))
                if keep is not None and table.num_rows:
                    users, rows = _distinct(table.column("user"), key_of)
                    table = table.filter(pa.array(np.asarray(keep(users), bool)[rows]))
                self._fold(kind, table)
        for user in list(self.arrived):
            self._settle(user)
        self.stored_ts = np.concatenate(times) if times else np.zeros(0, np.int64)
        held = [int(self.stored_ts.max())] if self.stored_ts.size else []
        held += [] if self.unstored_newest is None else [self.unstored_newest]
        self.newest, self.last_start = (max(held) if held else None), None
        return len(self.stored_ts)

    def forget(self, keep) -> int:
        """Drop the users ``keep`` (a function of user keys to a mask) does not keep: another
        refresher holds them now. Their number."""
        users = np.array(sorted(self.users()), dtype=object)
        gone = users[~np.asarray(keep(users), bool)] if len(users) else users
        for user in gone.tolist():
            for held in (self.rated, self.arrived, self.compared):
                held.pop(user, None)
        return len(gone)

    def add(self, kind: str, table: pa.Table, source=None) -> set[str]:
        """Fold in streamed events (``source``: the Kafka (topic, partition) they came from,
        or None); the users they touched."""
        if kind not in USER_KINDS or not table.num_rows:
            return set()
        users, rows = self._fold(kind, table)
        ts = table.column("ts").to_numpy().astype(np.int64)
        offsets = table.column("offset").to_numpy().astype(np.int64)
        self.unstored.setdefault(source, LatestOffsets()).add(self._user_codes(users)[rows],
                                                              offsets)
        if "last_events" in self.window:
            self.unstored_times.append((source, offsets, ts))
        newest = int(ts.max())
        self.newest = newest if self.newest is None else max(self.newest, newest)
        self.unstored_newest = newest if self.unstored_newest is None else \
            max(self.unstored_newest, newest)
        if self.last_start is not None:
            self.last_start = (self.last_start[0], self.last_start[1] + len(ts))
        return set(users[np.unique(rows)].tolist())

    def unstored_users(self, stored_until) -> set[str]:
        """Forget the streamed events the store holds now (``stored_until(source)``: the store's
        next offset of that Kafka topic partition, or None); the users of those it does not."""
        def left(source, offsets):     # a source-less event (not from Kafka) stays
            return offsets >= (stored_until(source) or 0) if source is not None else \
                np.ones(len(offsets), bool)

        users = set()
        for source, log in list(self.unstored.items()):
            codes, offsets = log.rows()
            mine = left(source, offsets)
            log.keep(mine)
            users.update(self.user_keys[c] for c in codes[mine].tolist())
            if not mine.any():
                del self.unstored[source]
        self.unstored_times = [(src, o[k], t[k]) for src, o, t in self.unstored_times
                               for k in [left(src, o)] if k.any()]
        return users

    def window_start(self) -> int | None:
        """The model's window over every event held (:func:`window_start`, training's rule):
        the first time a user's inputs keep, or None. ``last_days`` counts back from the
        newest time held; ``last_events`` is found again over every time held once 1% of the
        window has arrived since (its start moves by at most the arrivals: a pass over the
        times per 1% of the window, not per batch, for a window at most 1% too long)."""
        window = self.window
        if not window:
            return None
        if "last_days" in window:
            return None if self.newest is None else window_start(
                np.array([self.newest], np.int64), window)
        if self.last_start is None or self.last_start[1] >= max(1, window["last_events"] // 100):
            times = np.concatenate([self.stored_ts, self._unstored_ts()])
            self.last_start = (window_start(times, window), 0)
        return self.last_start[0]

    def _unstored_ts(self) -> np.ndarray:
        return np.concatenate([b[2] for b in self.unstored_times] or [np.zeros(0, np.int64)])

    def _user_codes(self, users: np.ndarray) -> np.ndarray:
        """Each user key's code (a new key gets the next): the log keeps 4 bytes per event, not
        each batch's own copies of its users' keys (a batch's keys are new str objects)."""
        codes = np.empty(len(users), np.int32)
        for n, user in enumerate(users.tolist()):
            code = self.user_code.get(user)
            if code is None:
                code = self.user_code[user] = len(self.user_keys)
                self.user_keys.append(user)
            codes[n] = code
        return codes

    def users(self) -> set[str]:
        return set(self.rated) | set(self.arrived) | set(self.compared)

    def inputs(self, user: str, index_of, spec: dict, token=None,
               start: int | None = None) -> FoldInInputs:
        """The user's :class:`FoldInInputs` from ``start`` on (the window's first time,
        :meth:`window_start`) by the version's fold-in ``spec``, in its item indices
        (``index_of(item)``: the index, or None; ``token`` names that version, to look each
        item up once)."""
        if bounds_of(spec) != tuple(self.bounds):
            raise ValueError(f"the history folds ratings within {self.bounds}, the spec asks "
                             f"for {bounds_of(spec)}: call use_bounds first")
        index = self._indices(index_of, token)
        rows = self._settle(user)
        if rows is None:
            rows = np.zeros(0, RATED)
        if start is not None:
            rows = rows[rows["ts"] >= start]
        pairs = [wl for key, wl in self.compared.get(user, {}).values()
                 if start is None or key[0] >= start]
        compared = np.array(pairs, np.int64).reshape(-1, 2)
        return inputs_from(index[rows["code"]], rows["rating"],
                           index[compared] if compared.size else compared, spec, user)

    def _indices(self, index_of, token) -> np.ndarray:
        """Each item code's index in the version ``token`` names (-1: unknown to it), items
        looked up once per version."""
        if token is None or token != self.index_token:
            self.index_token, self.index = token, np.zeros(0, np.int64)
        if len(self.index) < len(self.items):
            new = [index_of(item) for item in self.items[len(self.index):]]
            self.index = np.concatenate([self.index, np.array(
                [-1 if i is None else int(i) for i in new], np.int64)])
        return self.index

    # ------------------------------------------------------------------ folding
    def _fold(self, kind: str, table: pa.Table) -> tuple[np.ndarray, np.ndarray]:
        """Fold one kind's events in; (the distinct user keys, each row's position in them)."""
        users, rows = _distinct(table.column("user"), key_of)
        ts = table.column("ts").to_numpy().astype(np.int64)
        offsets = table.column("offset").to_numpy().astype(np.int64)
        if kind == "comparison":
            winners = self._codes(table.column("winner"))
            losers = self._codes(table.column("loser"))
            ids = table.column("event_id").to_pylist()
            for n, u in enumerate(rows.tolist()):
                seen = self.compared.setdefault(users[u], {})
                key, last = (int(ts[n]), int(offsets[n])), seen.get(str(ids[n]))
                if last is None or key >= last[0]:
                    seen[str(ids[n])] = (key, (int(winners[n]), int(losers[n])))
            return users, rows
        new = np.empty(len(rows), RATED)
        new["code"] = self._codes(table.column("item"))
        new["rating"] = (table.column("rating").to_numpy(zero_copy_only=False).astype(
            np.float64) if kind == "rating" else np.nan)
        new["ts"], new["offset"] = ts, offsets
        low, high = self.bounds
        r = new["rating"]
        inside = np.isnan(r) | ((r >= low) & (r <= high))
        order = np.argsort(rows[inside], kind="stable")
        batch, by_user = new[inside][order], rows[inside][order]
        cuts = np.flatnonzero(np.diff(by_user)) + 1
        for u, part in zip(by_user[np.r_[0, cuts]].tolist() if len(by_user) else [],
                           np.split(batch, cuts)):
            parts = self.arrived.setdefault(users[u], [])
            parts.append(part)
            if len(parts) >= 64:      # a user no batch reads (no version to refresh yet):
                self._settle(users[u])   # keep their rows, not every poll's arrays
        return users, rows

    def _settle(self, user: str) -> np.ndarray | None:
        """The user's rows with what arrived for them since folded in: once per read, not
        once per poll (a poll brings a user one event or two)."""
        parts = self.arrived.pop(user, None)
        if parts:
            self.rated[user] = _merged(self.rated.get(user),
                                       parts[0] if len(parts) == 1 else np.concatenate(parts))
        return self.rated.get(user)

    def _codes(self, column) -> np.ndarray:
        """Each row's item code, new items given the next ones."""
        def code(item):
            found = self.codes.get(item)
            if found is None:
                found = self.codes[item] = len(self.items)
                self.items.append(item)
            return found
        names, rows = _distinct(column, code)
        return names.astype(np.int64)[rows]


def _merged(rows: np.ndarray | None, new: np.ndarray) -> np.ndarray:
    """A user's ``rows`` (by code, one per item) with ``new`` ones (in arrival order) folded in:
    per item the latest by (ts, offset), a later arrival winning a tie (training's
    :func:`latest_per_key`), in one pass over the old rows at most (a batch brings a user a
    few events; sorting their whole history again made each batch slower as histories grew)."""
    if len(new) > 1:       # most users bring one event to a batch: nothing to sort then
        new = new[latest_per_key(new["code"], new["ts"], new["offset"])]
        new = new[np.argsort(new["code"], kind="stable")]
    if rows is None or not len(rows):
        return new
    at = rows["code"].searchsorted(new["code"])
    hit = rows["code"][np.minimum(at, len(rows) - 1)] == new["code"]
    if hit.any():
        now, was = new[hit], rows[at[hit]]
        later = (now["ts"] > was["ts"]) | ((now["ts"] == was["ts"])
                                           & (now["offset"] >= was["offset"]))
        rows[at[hit][later]] = now[later]
    return rows if hit.all() else np.insert(rows, at[~hit], new[~hit])


def _distinct(column, name) -> tuple[np.ndarray, np.ndarray]:
    """(``name(value)`` of each distinct value of an Arrow column, as an object array; each
    row's position in it), ``name`` called once per distinct value."""
    array = column.combine_chunks() if isinstance(column, pa.ChunkedArray) else column
    encoded = pc.dictionary_encode(array)
    values = encoded.dictionary.to_pylist()
    names = np.empty(len(values), object)
    names[:] = [name(v) for v in values]
    return names, encoded.indices.to_numpy(zero_copy_only=False).astype(np.int64)
