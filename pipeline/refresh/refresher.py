"""One model's refresher: every user touched by new events gets their factor recomputed by the
served version's own fold-in from their whole history, and their factor, seen items and list
rewritten under the current version in one atomic write per user
(:func:`pipeline.serving.fresh.write_fresh`); lookups then answer them with source ``fresh``.

The loop around it (:mod:`pipeline.refresh.kafka_source`, or :meth:`Refresher.apply` directly)
feeds events in and calls :meth:`Refresher.flush` every few hundred milliseconds, so each user
is recomputed once per batch however many events they sent. :meth:`Refresher.watch` follows
the served version:

- a **flip** (a retrain published): the store is read again and every user with an event
  after the new version's watermark (``meta.watermark``: the store offsets it learned from)
  is recomputed under it before the refresher calls itself caught up; recomputing from the
  whole history makes that harmless for users the version already knows;
- **no version** (Redis restarted empty): the last published checkpoint is republished
  (:func:`pipeline.training.steps.ensure_served`), said in the log and the stats, and then
  handled as a flip.

A version whose shape keeps no per-user state (a global list, a rating model, per-query lists)
or has no fold-in has nothing to refresh: that is said once.
"""

from __future__ import annotations

import logging
import time
from datetime import datetime, timezone

import numpy as np

from pipeline.refresh.events import bounds_of, fold_in_inputs
from pipeline.refresh.history import UserHistory
from pipeline.refresh.stats import RefreshStats
from pipeline.serving.layout import UnknownModelError
from pipeline.serving.sparse_factors import is_sparse

log = logging.getLogger(__name__)

FOLD_IN_ROWS = 50_000   # met rows + comparisons per batched fold-in call (Refresher._factors)


def input_rules(spec: dict) -> dict:
    """The spec whose keys say how a user's events count (``min_rating``, ``rating_range``,
    ``comparisons``, ``input``): the fold-in's own, or a blend's first part's."""
    for candidate in (spec, *spec.get("parts", ())):
        if "min_rating" in candidate or "comparisons" in candidate:
            return candidate
    return spec


def user_factor(st, factors, events, spec: dict, user: str = "", start: int | None = None):
    """``(factor, seen)`` of one user (``user``: their key) from their events (from ``start``
    on: the window's first time) by the version's fold-in, or None when none of their items
    is known to the version."""
    from pipeline.serving.item_queries import fold_in_method

    rules = input_rules(spec)
    inputs = fold_in_inputs(events, st.index_of, rules, user, start)
    if not inputs.seen.size and not inputs.pairs.size:
        return None
    met = inputs.seen if rules.get("input") == "met" else inputs.winners
    V, b = factors
    u = fold_in_method(spec.get("method")).user_factors(st, V, b, [met], [inputs.pairs], spec,
                                                        seen=[inputs.seen])
    return np.asarray(u, np.float32).reshape(-1), inputs.seen


class Refresher:
    """The refresher of ``model`` (config ``cfg``) against the Redis of ``topk``."""

    def __init__(self, model: str, cfg, settings, topk, store, *, redis_url: str | None = None):
        self.model, self.cfg, self.settings = model, cfg, settings
        self.topk, self.store, self.redis_url = topk, store, redis_url
        # the scale, until a version says; training's window
        self.history = UserHistory(bounds_of(cfg.params), cfg.window)
        self.stats = RefreshStats(model)
        self.state = None                  # the VersionState refreshed now
        self.pending: dict[str, list] = {}  # user key -> timestamps (ms) of live events
        self.replay: set[str] = set()       # users to recompute with no lag to count
        self.last: dict[str, np.ndarray] = {}   # user -> factor last written (this version)
        self.ownership = None   # whose histories it holds (pipeline.refresh.ownership; None: all)

    # ------------------------------------------------------------------ events in
    def apply(self, tables: dict, source=None, *, live: bool = True) -> int:
        """Add events (kind -> Arrow table) from ``source`` (a Kafka topic partition, or None);
        their users are recomputed at the next :meth:`flush`. ``live``: their refresh lag is
        counted (not for a replay of events already applied)."""
        from pipeline.serving.layout import key_of

        n = 0
        for kind, table in tables.items():
            if self.ownership is not None and source is not None and table.num_rows:
                self._check_keyed(table, source)
            touched = self.history.add(kind, table, source)
            n += table.num_rows
            if not live:
                self.replay |= touched
                continue
            for user, ts in zip(table.column("user").to_pylist(),
                                table.column("ts").to_pylist()):
                self.pending.setdefault(key_of(user), []).append(ts)
        self.stats.events += n
        return n

    def apply_events(self, events: list[dict], kind: str | None = None) -> int:
        """Validate and :meth:`apply` events given as dicts (a file or a test, no Kafka);
        invalid ones are skipped (ingest dead-letters them); the number applied."""
        from pipeline.ingest.buffer import PartitionBuffer

        buf = PartitionBuffer("direct", 0, default_kind=kind)
        buf.add_rows(list(events), list(range(len(events))))
        return self.apply(buf.take_events())

    # ------------------------------------------------------------------ whose histories
    def hold(self, ownership) -> None:
        """Hold the histories of the users ``ownership`` names (an
        :class:`~pipeline.refresh.ownership.Ownership` of this refresher's partitions; None,
        or for good once a partition brought a user hashed elsewhere: every user's). Those no
        longer held are dropped; those newly held are read from the store now, if a version
        is served (else at its switch), and their partitions bring the rest."""
        old, self.ownership = self.ownership, (None if self.stats.unkeyed else ownership)
        new = self.ownership
        if (old is None and new is None) or (new is not None and old is not None
                                             and new.within(old) and old.within(new)):
            return         # the same users (a rebalance that gave the same partitions back)
        if new is not None:
            self.history.forget(new.owns)
            kept = _held(new, self.pending)
            self.pending = {u: t for u, t in self.pending.items() if u in kept}
            self.replay = _held(new, self.replay)
        gained = old is not None and not (new is not None and new.within(old))
        if gained and self.state is not None and not self.stats.nothing_to_refresh:
            self.history.load_store(self.store, self.cfg.kinds, keep=lambda keys: (
                ~old.owns(keys) if new is None else new.owns(keys) & ~old.owns(keys)))
        self.stats.users_held = len(self.history.users())
        log.info("%s: holding the histories of %s (%d users)", self.model,
                 "every user" if new is None else f"the users of {new.describe()}",
                 self.stats.users_held)

    def _check_keyed(self, table, source) -> None:
        """Hold every user from now on where ``source`` (topic, partition) brings an event of
        a user whose key hashes to another partition: its topic is not keyed by user."""
        from pipeline.serving.layout import key_of

        strays = self.ownership.strays(sorted({key_of(u) for u in table.column("user")
                                               .to_pylist()}), *source)
        if strays:
            self.stats.unkeyed = (f"{source[0]}/{source[1]} brought an event of user "
                                  f"{strays[0]!r}, whose key hashes to another partition")
            log.warning("%s: %s: its topic is not keyed by user, so this refresher holds every "
                        "user's history from now on (send events with `rankstream produce`, or "
                        "copy them with `rankstream rekey`)", self.model, self.stats.unkeyed)
            self.hold(None)

    # ------------------------------------------------------------------ versions
    def watch(self) -> str:
        """Follow ``current``: ``"same"``, ``"flipped"`` (users since its watermark queued),
        ``"healed"`` (republished, then flipped) or ``"none"`` (nothing to serve yet)."""
        try:
            st = self.topk.versions.current_state(self.model)
        except UnknownModelError:
            return "healed" if self._heal() else "none"
        if self.state is not None and (st.version, st.publish_id) == (
                self.state.version, self.state.publish_id):
            return "same"
        self._switch(st)
        return "flipped"

    def _switch(self, st) -> None:
        """Serve ``st`` from now on: read the store again, queue every user with events after
        its watermark, and every user whose streamed events the store does not hold yet."""
        first = self.state is None
        self.state, self.stats.version = st, st.version
        self.last = {}
        if not first:
            self.stats.flips += 1
        if not st.per_key or not st.rank or not st.fold_in:
            why = (f"version {st.version} of {self.model!r} ({st.kind}, served as "
                   f"{st.meta.get('served_as', 'model')}) keeps no per-user factors to refresh")
            if why != self.stats.nothing_to_refresh:
                log.warning("%s: nothing to refresh", why)
                self.stats.nothing_to_refresh = why
            return
        self.stats.nothing_to_refresh = ""
        self.history.use_bounds(bounds_of(input_rules(st.fold_in)))
        held = self.ownership
        self.history.load_store(self.store, self.cfg.kinds,
                                keep=None if held is None else held.owns)
        next_offsets = self.store.next_offsets(kinds=self.cfg.kinds)
        unstored = self.history.unstored_users(lambda src: next_offsets.get(
            (self.store.generation(*src), src[1])))
        self.replay |= _held(held, self._users_since(watermark_of(st)) | unstored)
        self.stats.users_held = len(self.history.users())
        log.info("%s: serving version %s; %d users have events after its watermark",
                 self.model, st.version, len(self.replay))

    def _users_since(self, watermark: dict | None) -> set[str]:
        """Users with stored events at or after ``watermark`` (all users without one)."""
        if watermark is None:
            return self.history.users()
        from pipeline.refresh.events import COLUMNS, USER_KINDS, events_of

        start = {(name, int(p)): int(o) for name, p, o in watermark}
        users = set()
        for kind in self.cfg.kinds:
            if kind in USER_KINDS:
                table = self.store.read(kind, start_offsets=start, columns=COLUMNS[kind])
                users |= {u for u, _ in events_of(kind, table)}
        return users

    def _heal(self) -> bool:
        """Republish the last published checkpoint when Redis serves nothing for the model."""
        from pipeline.training.checkpoints import latest_checkpoint
        from pipeline.training.run_store import open_run_store
        from pipeline.training.run_types import RunContext
        from pipeline.training.steps import ensure_served

        if self.redis_url is None:
            return False
        open_run_store(self.settings).pull_checkpoints(self.model)
        ckpt = latest_checkpoint(self.settings.checkpoint_dir, self.model,
                                 algorithm=self.cfg.algorithm)
        if ckpt is None or not (ckpt.path / "artifact").is_dir():
            return False
        ctx = RunContext(self.model, self.cfg, self.settings, self.redis_url)
        done = ensure_served(ctx, ckpt.path)
        if not done["republished"]:
            return False
        self.stats.heals += 1
        self.stats.last_heal = datetime.now(timezone.utc).isoformat(timespec="seconds")
        log.warning("%s: healed: %s", self.model, done["reason"])
        self.state = None
        self.watch()
        return True

    # ------------------------------------------------------------------ recompute, write
    def flush(self, batch: int = 2000) -> int:
        """Recompute and write the pending users (live ones first, at most ``batch`` replayed
        ones); the number written."""
        st = self.state
        if st is None or self.stats.nothing_to_refresh:
            self.pending.clear()
            self.replay.clear()
            return 0
        live = list(self.pending)
        replay = [u for u in list(self.replay)[:batch] if u not in self.pending]
        users = live + replay
        if not users:
            return 0
        written = self._write(st, users)
        if written is None:       # the version moved under us: requeue, follow it
            self.replay |= set(users)
            self.watch()
            return 0
        now_ms = time.time() * 1000.0
        for user in live:
            for ts in self.pending.pop(user, ()):
                self.stats.lag((now_ms - ts) / 1000.0)
        self.replay.difference_update(users)
        self.stats.users_refreshed += written
        self.stats.replayed_users += len(replay)
        return written

    def _write(self, st, users: list[str]) -> int | None:
        """Fold in and write ``users`` under ``st``; None when its pointer moved."""
        from pipeline.serving.fresh import FreshUser, fresh_lists, write_fresh

        factors = self.topk.lists.factors(st)
        stamp = int(time.time() * 1000)
        made = self._factors(st, factors, users)
        if not made:
            return 0
        lists = fresh_lists(st, factors, np.stack([u for _, u, _ in made]),
                            [seen for _, _, seen in made], st.top_k)
        fresh = [FreshUser(user, u, seen.astype(np.int32), pairs, stamp)
                 for (user, u, seen), pairs in zip(made, lists)]
        done = write_fresh(self.topk.transport.client, self.topk.versions.keys(self.model),
                           st.version, st.publish_id, fresh, sparse=is_sparse(st.meta))
        return None if not all(done) else len(fresh)

    def _factors(self, st, factors, users: list[str]) -> list[tuple]:
        """``(user, factor, seen)`` of each user with an item the version knows, by the
        version's fold-in, in batched calls of about ``FOLD_IN_ROWS`` met rows and comparisons
        each (what :func:`user_factor` gives one by one, from each user's digest instead of
        their whole history re-read). A user's answer depends on their inputs only, so the
        groups change no bits; they bound what a batch allocates: one that touched all of
        MovieLens's users, each with 700 items, drew 6.6M losers at once, and the refresher's
        RSS swung 50 MiB with the batch it was sampled in."""
        spec = st.fold_in
        rules = input_rules(spec)
        index, token = _memo_index(st), (st.version, st.publish_id)
        start = self.history.window_start()    # training's window, as of now
        made, group, rows = [], [], 0
        for user in users:
            x = self.history.inputs(user, index, rules, token, start)
            if x.seen.size or x.pairs.size:
                group.append((user, x))
                rows += x.seen.size + x.pairs.shape[0]
            if rows >= FOLD_IN_ROWS:
                made += self._fold_in(st, factors, group, rules)
                group, rows = [], 0
        return made + (self._fold_in(st, factors, group, rules) if group else [])

    def _fold_in(self, st, factors, inputs: list, rules: dict) -> list[tuple]:
        """:meth:`_factors` of one group of ``(user, inputs)``, in one batched call."""
        from pipeline.serving.item_queries import fold_in_method

        spec = st.fold_in
        met = [x.seen if rules.get("input") == "met" else x.winners for _, x in inputs]
        V, b = factors
        # an iterative fold-in (AltSVM's Newton) starts from the user's last factor: the
        # same optimum, in a step or two instead of four or five
        U = fold_in_method(spec.get("method")).user_factors(   # no met item drawn as a loser
            st, V, b, met, [x.pairs for _, x in inputs], spec,
            starts=[self.last.get(user) for user, _ in inputs], seen=[x.seen for _, x in inputs])
        U = np.asarray(U, np.float32).reshape(len(inputs), st.rank)
        if not is_sparse(st.meta):   # a sparse version's factor is as wide as its catalogue
            for n, (user, _) in enumerate(inputs):
                self.last[user] = U[n].copy()     # not a view that keeps the batch
        return [(user, U[n], x.seen) for n, (user, x) in enumerate(inputs)]


def _memo_index(st):
    """``st.index_of``, each item looked up once per version (kept in ``st.derived``)."""
    memo = st.derived.setdefault("index_memo", {})

    def index(item):
        try:
            return memo[item]
        except KeyError:
            found = memo[item] = st.index_of(item)
            return found
        except TypeError:       # unhashable: index_of says None
            return st.index_of(item)
    return index


def watermark_of(st) -> list | None:
    """``[(store topic name, partition, next offset)]`` of a version's watermark, or None."""
    raw = getattr(st, "watermark", None)
    if not raw:
        return None
    out = []
    for key, offset in raw.items():
        name, _, partition = str(key).rpartition("/")
        out.append((name, int(partition), int(offset)))
    return out


def _held(ownership, users) -> set[str]:
    """The users of ``users`` (keys) that ``ownership`` holds (all of them where None)."""
    users = sorted(users)
    if ownership is None or not users:
        return set(users)
    return {u for u, mine in zip(users, ownership.owns(users)) if mine}
