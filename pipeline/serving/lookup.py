"""Online top-K lookups from the versions :func:`pipeline.serving.publish.publish` wrote to Redis.

One round trip per answer from a precomputed list: ``MGET <bucket pointer> <list key>`` with
the version this process last saw; the user's bucket pointer and list share a hash tag (one
slot, one node of a cluster), and ``MGET`` is atomic, so when the returned pointer names that
version the list belongs to it. When the pointer names another version, the client loads that
version's item ids once (they are immutable per version) and asks again. Answers map the
stored item indices to ids in process. A batch asks every bucket it touches (one ``MGET`` on a
single Redis, one per bucket pipelined per node on a cluster) and answers only when every
pointer names the same version. ``REDIS_LAYOUT.md`` has the argument why no answer mixes
versions.

Other answers take one more round trip: users with a factor but no precomputed list (or
``k`` beyond the precomputed length) are scored on demand from their factor and the version's
item factors (read once per version, kept in memory); unknown users or queries get the
version's fallback list and ``source == "fallback"`` says so.

Candidates given in the request (:meth:`TopK.rank`, :meth:`TopK.predict_rating`) are scored in
process by the version's :class:`~pipeline.serving.scorers.Scorer` (read once per version):
one round trip (``GET current``) per answer.

When Redis is down or slower than ``timeout``: ``on_error="raise"`` raises
:class:`RedisUnavailable`; ``on_error="last_known"`` answers from an in-process cache of the
last answers (``stale=True``; users never answered get the last-known fallback list). After a
failure the client does not touch Redis for ``retry_interval`` seconds. On a cluster, a
``MOVED`` reply or a node that stopped answering first refreshes the slot map and tries once
more (a failover: the promoted replica answers), and only then does the policy apply.

Examples
--------
>>> topk = TopK("redis://127.0.0.1:6379/0", namespace="rankstream")  # doctest: +SKIP
>>> rec = topk.recommend("movies", "alice", k=3)  # doctest: +SKIP
>>> rec.items, rec.source, rec.version  # doctest: +SKIP
([(1193, 4.2), (661, 3.9), (914, 3.7)], 'precomputed', 7)
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from dataclasses import dataclass, replace
from zlib import crc32

import numpy as np

from pipeline.serving.layout import (
    BUCKET_MIX,
    BUCKET_SHIFT,
    BUCKETS,
    LayoutError,
    ModelKeys,
    UnknownModelError,
    bucket_of,
    key_of,
    pair_struct,
    parse_pointer,
    unpack_f32,
    unpack_i32,
)
from pipeline.serving.lookup_routes import Routes
from pipeline.serving.redis_client import (
    as_client,
    client_from_url,
    is_cluster,
    server_is_cluster,
    split_cluster_flag,
)
from pipeline.serving.redis_wire import round_trip, round_trips
from pipeline.serving.version_cache import (
    Vanished,
    VersionState,
    load_factors,
    load_scorer,
    load_version_state,
)
from pipeline.settings import redact
from solvers.topk import topk_of_scores

__all__ = ["TopK", "Recommendation", "Prediction", "RedisUnavailable", "LayoutError",
           "UnknownModelError"]

_ATTEMPTS = 10  # re-resolutions when versions vanish or a batch straddles a pointer move
_REPAIR_AT = 5  # attempt at which a batch still straddling moves the pointers itself
COUNT_FLUSH = 10.0  # seconds between flushes of the answer counts to Redis


class RedisUnavailable(ConnectionError):
    """Redis did not answer (down, refused, or slower than the timeout)."""


@dataclass(slots=True)
class Recommendation:
    """One answer of :class:`TopK`.

    Attributes
    ----------
    model : str
    user : object
        The user (or query) as asked; ``None`` for global lists.
    items : list of (item id, score)
        Best first.
    version : int
        The published version the answer comes from (all of it: versions never mix).
    source : str
        ``"precomputed"`` (the user's own stored list), ``"on_demand"`` (scored now from the
        user's factor), ``"global"`` (the model is one global list), ``"fallback"`` (unknown
        user/query: the version's fallback list), ``"missing"`` (unknown, and no fallback),
        ``"scored"`` (candidates given in the request, scored by the version's model). A
        version that serves something other than the trained model reports what instead of
        its own answers' source: ``"trivial"`` (a trivial list: the model did not beat it),
        ``"challenger-NAME"`` or ``"blend-NAME"`` (the gate's challenger won; the version's
        ``served_as``).
    stale : bool
        True when Redis was unavailable and this is the last-known answer.
    """

    model: str
    user: object
    items: list
    version: int
    source: str
    stale: bool = False


@dataclass(slots=True)
class Prediction:
    """One answer of :meth:`TopK.predict_rating`: the rating, the continuous ranking score it
    comes with (higher is better), and the version that computed both."""

    model: str
    rating: int
    score: float
    version: int
    stale: bool = False


_STRUCTS = [pair_struct(n) for n in range(257)]


def _pairs(st: VersionState, value: bytes, k: int, key: str) -> list:
    """Stored pairs -> [(item id, score)] (first ``k``), validated against the version."""
    n = len(value) >> 3
    if len(value) & 7 or n > st.top_k:
        raise LayoutError(f"{key} holds {len(value)} bytes, not up to {st.top_k} "
                          "(int32 index, float32 score) pairs")
    if n > k:
        n = k
    flat = (_STRUCTS[n] if n <= 256 else pair_struct(n)).unpack_from(value)
    ids = st.item_ids
    try:
        return list(zip([ids[i] for i in flat[0::2]], flat[1::2]))
    except IndexError:
        raise LayoutError(f"{key} lists an item index outside the version's {st.n_items} "
                          "items") from None


class TopK:
    """Top-K lookup client.

    Parameters
    ----------
    redis : str or redis.Redis or redis.cluster.RedisCluster
        A URL (``redis://``, ``rediss://`` for TLS, ``unix://``; AUTH as
        ``redis://:password@host:port/db``; any node of a Redis Cluster, see
        :mod:`pipeline.serving.redis_client`) or a redis-py client (its own timeouts apply).
    namespace : str
        Key namespace the models were published under.
    on_error : {"raise", "last_known"}
        Policy when Redis is down or slow (see the module docstring).
    timeout : float
        Seconds to wait for Redis on a lookup (connect and read) before the policy applies.
    load_timeout : float
        Seconds allowed for reading a new version's item ids/factors (bigger values).
    retry_interval : float
        After a failure, seconds during which lookups do not touch Redis.
    last_known_size : int
        Answers remembered for ``on_error="last_known"``.

    Examples
    --------
    >>> from pipeline.serving.artifact import ModelArtifact
    >>> from pipeline.serving.embedded_redis import EmbeddedRedis
    >>> from pipeline.serving.publish import publish
    >>> art = ModelArtifact.user_item(user_ids=["ann", "bob"], item_ids=[10, 11, 12],
    ...                               user_factors=[[1.0], [-1.0]],
    ...                               item_factors=[[0.5], [2.0], [1.0]])
    >>> with EmbeddedRedis() as server:
    ...     _ = publish("movies", art, server.url, top_k=2)
    ...     with TopK(server.url, on_error="last_known") as topk:
    ...         ann = topk.recommend("movies", "ann", k=2)
    ...         answers = topk.recommend_many("movies", ["bob", "nobody"], k=2)
    >>> ann.items, ann.source, ann.version
    ([(11, 2.0), (12, 1.0)], 'precomputed', 1)
    >>> [(r.items, r.source) for r in answers]
    [([(10, -0.5), (12, -1.0)], 'precomputed'), ([(10, 0.0), (11, 0.0)], 'fallback')]
    """

    def __init__(self, redis, *, namespace: str = "rankstream", on_error: str = "raise",
                 timeout: float = 0.1, load_timeout: float = 10.0, retry_interval: float = 0.5,
                 last_known_size: int = 100_000):
        if on_error not in ("raise", "last_known"):
            raise ValueError(f"on_error is {on_error!r}, expected 'raise' or 'last_known'")
        if isinstance(redis, str):
            url, cluster = split_cluster_flag(redis)
            if cluster is None:   # ask the server once, for both clients
                cluster = server_is_cluster(url, timeout)
            self._client = client_from_url(url, timeout=timeout, cluster=cluster)
            self._bulk = client_from_url(url, timeout=load_timeout, cluster=cluster)
            self._where = redact(redis)
        else:
            self._client = self._bulk = as_client(redis)
            self._where = _describe(self._client)
        self._routes = Routes(self._client)
        self._cluster = is_cluster(self._client)
        self.namespace = namespace
        self.on_error = on_error
        self.retry_interval = float(retry_interval)
        self._keys: dict[str, ModelKeys] = {}
        self._current: dict[str, VersionState] = {}  # model -> last version seen current
        self._states: dict[bytes, VersionState] = {}  # "{tag}|current value" -> state
        self._last: dict | None = {} if on_error == "last_known" else None
        self._last_size = int(last_known_size)
        self._down_until = 0.0
        self._last_error: Exception | None = None
        self._lock = threading.Lock()
        self._total: Counter = Counter()       # (model, version, source) -> answers
        self._unflushed: Counter = Counter()
        self._next_flush = time.monotonic() + COUNT_FLUSH
        self._flush_counts = True

    @classmethod
    def from_settings(cls, settings, **kwargs) -> TopK:
        """A client for ``settings.redis_url`` with the settings' namespace, timeout and
        failure policy (``RANKSTREAM_REDIS_*``); ``kwargs`` override.

        Examples
        --------
        >>> from pipeline.settings import Settings
        >>> s = Settings(redis_url="redis://127.0.0.1:6379/0", redis_on_error="last_known")
        >>> TopK.from_settings(s).on_error
        'last_known'
        """
        if not settings.redis_url:
            raise ValueError("no Redis URL configured (RANKSTREAM_REDIS_URL); for a run "
                             "without one, start pipeline.serving.embedded_redis."
                             "redis_url_for(settings) and pass its URL")
        options = {"namespace": settings.namespace, "timeout": settings.redis_timeout,
                   "on_error": settings.redis_on_error, **kwargs}
        return cls(settings.redis_url, **options)

    # ------------------------------------------------------------------ connection
    def _send(self, keys: ModelKeys, bucket: int, commands: list[tuple]) -> list:
        """:func:`~pipeline.serving.redis_wire.round_trip` on this thread's connection to the
        node serving ``bucket`` of ``keys``' model (``BUCKETS``: the model tag). A dropped
        connection (e.g. after a Redis restart) or, on a cluster, a ``MOVED`` reply or a node
        that stopped answering refreshes the route and is tried once more; then
        :class:`_Down`."""
        for attempt in (0, 1):
            try:
                return round_trip(self._routes.table(keys)[bucket], commands)
            except Exception as err:
                self._retry_or_raise(err, attempt)

    def _send_many(self, keys: ModelKeys, commands: list[tuple[int, tuple]]) -> list:
        """``(bucket, command)`` pairs in one round trip per node, all nodes at once; replies
        in order. Retried like :meth:`_send`."""
        for attempt in (0, 1):
            table = self._routes.table(keys)
            groups: dict[int, tuple] = {}
            for i, (bucket, command) in enumerate(commands):
                conn = table[bucket]
                group = groups.get(id(conn))
                if group is None:
                    group = groups[id(conn)] = (conn, [], [])
                group[1].append(i)
                group[2].append(command)
            try:
                replies = round_trips([(conn, cmds) for conn, _, cmds in groups.values()])
            except Exception as err:
                self._retry_or_raise(err, attempt)
                continue
            out: list = [None] * len(commands)
            for (_, order, _), got in zip(groups.values(), replies):
                for i, reply in zip(order, got):
                    out[i] = reply
            return out

    def _retry_or_raise(self, err: Exception, attempt: int) -> None:
        """Return to try again, or raise: :class:`_Down` for a server that is gone, slow or
        (cluster) failing over; the error itself otherwise. On a cluster every such failure
        re-reads the slot map first (a timeout too: a primary cut off by the network is
        failed over like a dead one, and the next attempt after the retry interval must go to
        its replica); a timeout is never retried at once (the caller's latency budget)."""
        import redis
        from redis.exceptions import AskError, ClusterDownError, TryAgainError

        if isinstance(err, (AskError, TryAgainError)):   # MOVED/ASK: the slot map changed
            self._refresh_routes(err)
            if attempt:
                raise _Down(err) from err
        elif isinstance(err, ClusterDownError):
            raise _Down(err) from err
        elif isinstance(err, (redis.ResponseError, redis.AuthenticationError)):
            raise err
        elif isinstance(err, (redis.ConnectionError, redis.TimeoutError, OSError)):
            if self._cluster:
                self._refresh_routes(err)
            if attempt or isinstance(err, redis.TimeoutError):
                raise _Down(err) from err
        else:
            raise err

    def _refresh_routes(self, err: Exception) -> None:
        try:
            self._routes.refresh()
        except Exception as failed:   # no node answers
            raise _Down(failed) from err

    def close(self) -> None:
        """Flush the answer counts and close the connections of this client."""
        if self._flush_counts and self._unflushed and not self._down_until:
            self._flush()
        self._routes.close()
        self._client.close()
        if self._bulk is not self._client:
            self._bulk.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    # ------------------------------------------------------------------ public API
    def recommend(self, model: str, user=None, k: int = 10) -> Recommendation:
        """Top ``k`` (item id, score) for ``user``; ``None``: the model's list for everyone
        (a global-list model's list, or a per-user model's fallback list).

        Examples
        --------
        >>> topk.recommend("movies", 42, k=2).items  # doctest: +SKIP
        [(1193, 4.25), (661, 3.5)]
        """
        rec = self._recommend(model, user, k)
        self._count(model, rec)
        return rec

    def recommend_many(self, model: str, users, k: int = 10) -> list[Recommendation]:
        """:meth:`recommend` for many users in one round trip (all from one version).

        Examples
        --------
        >>> [r.source for r in topk.recommend_many("movies", [1, 2, 3])]  # doctest: +SKIP
        ['precomputed', 'precomputed', 'fallback']
        """
        out = self._recommend_many(model, users, k)
        for rec in out:
            self._count(model, rec)
        return out

    def rank(self, model: str, candidates, k: int = 10, query=None) -> Recommendation:
        """The top ``k`` of ``candidates`` given in the request, scored by the current
        version's model (the re-ranking call of a search stack): ``source == "scored"``.

        ``candidates`` is a sequence of ``(id, x)``; ``x`` is a features list or
        ``{index: value}`` map as in events, a text (str), or ``{"features": ..., "text": ...}``
        (text for models trained on text). ``query`` is recorded in the answer. With
        ``on_error="last_known"`` and Redis down, the last version's cached model answers
        (``stale=True``).

        Examples
        --------
        >>> docs = [("d1", [0.2, 1.0]), ("d2", [0.9, 0.1])]
        >>> topk.rank("search", docs, k=1, query="shoes").items  # doctest: +SKIP
        [('d2', 1.73)]
        """
        if k < 0:
            raise ValueError(f"k is {k}, it must be >= 0")
        candidates = list(candidates)
        for n, c in enumerate(candidates):
            if not isinstance(c, (tuple, list)) or len(c) != 2:
                raise ValueError(f"candidates[{n}] is {c!r:.60}, expected an (id, features) "
                                 "pair")
        st, stale = self._scorer_state(model)
        scores = st.scorer.score(st.scorer.rows([x for _, x in candidates]))
        best = np.argsort(-scores, kind="stable")[:k]
        rec = Recommendation(model, query, [(candidates[i][0], float(scores[i])) for i in best],
                             st.version, st.sources["scored"], stale)
        self._count(model, rec)
        return rec

    def predict_rating(self, model: str, features=None, text=None) -> Prediction:
        """An ordinal model's rating of one item described in the request by ``features``
        (list or ``{index: value}`` map, as in events) and/or ``text``.

        Examples
        --------
        >>> topk.predict_rating("reviews", text="a warm, funny film").rating  # doctest: +SKIP
        4
        """
        if features is None and text is None:
            raise ValueError("predict_rating needs features or text, got neither")
        st, stale = self._scorer_state(model)
        X = st.scorer.rows([{"features": features, "text": text}])
        return Prediction(model, int(st.scorer.predict_rating(X)[0]),
                          float(st.scorer.score(X)[0]), st.version, stale)

    # ------------------------------------------------------------------ answer sources
    def stats(self) -> dict:
        """How this client's answers came about, per model: ``{model: {source: count}}``
        (sources as in :class:`Recommendation`; ``stale`` counts last-known answers).

        Examples
        --------
        >>> topk.stats()  # doctest: +SKIP
        {'movies': {'precomputed': 9812, 'fallback': 188}}
        """
        out: dict = {}
        for (model, _, source), n in self._total.items():
            out.setdefault(model, {}).setdefault(source, 0)
            out[model][source] += n
        return out

    def _count(self, model: str, rec: Recommendation) -> None:
        key = (model, rec.version, "stale" if rec.stale else rec.source)
        self._total[key] += 1
        self._unflushed[key] += 1
        if self._flush_counts and time.monotonic() >= self._next_flush:
            self._flush()

    def _flush(self) -> None:
        """Add the counts since the last flush to the model's ``lookups`` hash in Redis (one
        round trip every ``COUNT_FLUSH`` seconds at most), where ``rankstream models`` reads
        the share of fallback answers. Best effort: a replica that refuses writes turns it
        off, a failure loses only these counts."""
        import redis

        self._next_flush = time.monotonic() + COUNT_FLUSH
        counts, self._unflushed = self._unflushed, Counter()
        pipe = self._client.pipeline(transaction=False)
        for (model, version, source), n in counts.items():
            pipe.hincrby(self._model_keys(model).lookups, f"{version}:{source}", n)
        try:
            pipe.execute()
        except redis.ResponseError:       # READONLY replica, NOPERM: stop trying
            self._flush_counts = False
        except (redis.RedisError, OSError):
            pass

    def _recommend(self, model: str, user, k: int) -> Recommendation:
        st = self._current.get(model)
        if st is not None and not self._down_until:
            if st.per_key and user is not None and 0 <= k and (k <= st.top_k or not st.rank):
                key = user if type(user) is str else key_of(user)
                b = ((crc32(key.encode()) * BUCKET_MIX) & 0xFFFFFFFF) >> BUCKET_SHIFT
                try:
                    ptr, value = self._send(st.keys, b, [("MGET", st.pointer_keys[b],
                                                          st.topk_prefixes[b] + key)])[0]
                except _Down as down:
                    return self._failed(model, [user], k, down.err)[0]
                if value is not None and ptr is not None and ptr.startswith(st.pointer_prefix):
                    rec = Recommendation(model, user, _pairs(st, value, k, key), st.version,
                                         st.sources["precomputed"])
                    if self._last is not None:
                        self._remember(model, key, rec)
                    return rec
            elif not st.per_key:
                try:
                    cur = self._send(st.keys, BUCKETS, [("GET", st.keys.current)])[0]
                except _Down as down:
                    return self._failed(model, [user], k, down.err)[0]
                if st.names(cur):
                    return self._global(st, user, k)
        return self._resolve(model, [user], k)[0]

    def _recommend_many(self, model: str, users, k: int) -> list[Recommendation]:
        users = list(users)
        st = self._current.get(model)
        if not users:
            return []
        if (st is not None and st.per_key and not self._down_until and 0 <= k
                and (k <= st.top_k or not st.rank) and None not in users):
            keys = [u if type(u) is str else key_of(u) for u in users]
            buckets = [((crc32(x.encode()) * BUCKET_MIX) & 0xFFFFFFFF) >> BUCKET_SHIFT
                       for x in keys]
            prefixes = st.topk_prefixes
            try:
                pointers, values, _ = self._bucket_mget(
                    st, buckets, [prefixes[b] + x for b, x in zip(buckets, keys)])
            except _Down as down:
                return self._failed(model, users, k, down.err)
            first = pointers[0]       # synced pointers are equal bytes: one C-level count
            if ((first is not None and first.startswith(st.pointer_prefix)
                 and pointers.count(first) == len(pointers) or all(map(st.names, pointers)))
                    and None not in values):
                source = st.sources["precomputed"]
                out = [Recommendation(model, u, _pairs(st, v, k, x), st.version, source)
                       for u, x, v in zip(users, keys, values)]
                if self._last is not None:
                    for x, rec in zip(keys, out):
                        self._remember(model, x, rec)
                return out
        return self._resolve(model, users, k)

    def _bucket_mget(self, st: VersionState, buckets: list[int], names: list[str],
                     per: int = 1, extra: list[tuple[int, tuple]] = ()) -> tuple[list, list,
                                                                                  list]:
        """Read ``names`` (``per`` consecutive keys for each item; item ``i``'s keys lie in
        bucket ``buckets[i]``) with the pointer of every bucket involved, in one round trip:
        (pointer values, the values in the order of ``names``, replies of the ``extra``
        commands). A single Redis gets one ``MGET`` (atomic over all of it); a cluster one
        ``MGET`` per bucket (its pointer and keys share a slot), pipelined per node."""
        ptr_keys = st.pointer_keys
        if not self._cluster:
            distinct = list(dict.fromkeys(buckets))
            n = len(distinct)
            command = ("MGET", *[ptr_keys[b] for b in distinct], *names)
            if not extra:
                reply = self._send(st.keys, 0, [command])[0]
                return reply[:n], reply[n:], []
            replies = self._send(st.keys, 0, [*(c for _, c in extra), command])
            return replies[-1][:n], replies[-1][n:], replies[:-1]
        rows_of: dict[int, list[int]] = {}
        for i, b in enumerate(buckets):
            rows = rows_of.get(b)
            if rows is None:
                rows_of[b] = [i]
            else:
                rows.append(i)
        commands = list(extra)
        for b, rows in rows_of.items():
            commands.append((b, ("MGET", ptr_keys[b],
                                 *[names[j] for i in rows for j in range(i * per, i * per + per)])))
        replies = self._send_many(st.keys, commands)
        pointers = []
        values: list = [None] * len(names)
        for rows, reply in zip(rows_of.values(), replies[len(extra):]):
            pointers.append(reply[0])
            at = 1
            for i in rows:
                values[i * per:i * per + per] = reply[at:at + per]
                at += per
        return pointers, values, replies[:len(extra)]

    # ------------------------------------------------------------------ slow path
    def _model_keys(self, model: str) -> ModelKeys:
        keys = self._keys.get(model)
        if keys is None:
            keys = self._keys[model] = ModelKeys(self.namespace, model)
        return keys

    def _resolve(self, model: str, users: list, k: int) -> list[Recommendation]:
        if k < 0:
            raise ValueError(f"k is {k}, it must be >= 0")

        def attempt():
            out = self._resolve_once(model, users, k)
            if self._last is not None:
                for u, rec in zip(users, out):
                    if rec.user is not None:
                        self._remember(model, key_of(u), rec)
            return out

        return self._guarded(model, attempt,
                             lambda err, again: self._failed(model, users, k, err, again))

    def _scorer_state(self, model: str) -> tuple[VersionState, bool]:
        """(current version with its scorer loaded, stale): the last version's when Redis is
        down and the policy is last-known."""
        def attempt():
            st = self._current_state(model)
            load_scorer(self._bulk, st)
            return st, False

        def failed(err, again):
            msg = self._went_down(err, again)
            st = self._current.get(model)
            if self._last is None or st is None or st.scorer is None:
                raise RedisUnavailable(msg + ("" if self._last is None else
                                              f"; and no cached model for {model!r}")) from err
            return st, True

        return self._guarded(model, attempt, failed)

    def _guarded(self, model: str, attempt, failed):
        """``attempt()``, again while versions vanish under it or a batch straddles a pointer
        move (after a short wait; from attempt ``_REPAIR_AT`` on it moves the pointers itself,
        in case the publisher died between its flip and the pointers); ``failed(err, again)``
        when Redis is down (``again``: a new failure, not the retry interval of an old one)."""
        if self._down_until:
            if time.monotonic() < self._down_until:
                return failed(self._last_error, False)
            self._down_until = 0.0
        straddled = 0
        try:
            for n in range(_ATTEMPTS):
                try:
                    return attempt()
                except _Straddles:
                    straddled += 1
                    if n >= _REPAIR_AT:
                        self._repair(model)
                    time.sleep(min(0.001 * 2 ** n, 0.1))
                except Vanished:
                    continue
        except _Down as down:
            return failed(down.err, True)
        except Exception as err:
            import redis

            if isinstance(err, (redis.ConnectionError, redis.TimeoutError)) and not isinstance(
                    err, redis.AuthenticationError):
                return failed(err, True)
            raise
        if straddled:
            raise LayoutError(f"model {model!r}: the bucket pointers did not agree on one version "
                              f"in {_ATTEMPTS} tries (a pointer move that does not finish: run "
                              "`rankstream rollback --to <current version>` to move them)")
        raise LayoutError(f"model {model!r}: the current version vanished {_ATTEMPTS} times "
                          "while being read (publishing faster than versions are kept?)")

    def _repair(self, model: str) -> None:
        """Best effort: copy ``current`` to the bucket pointers behind it (a reader on a replica
        cannot; then only a publish or rollback will)."""
        from pipeline.serving.versions import sync_pointers

        try:
            sync_pointers(self._bulk, self._model_keys(model), attempts=1)
        except Exception:
            pass

    def _state(self, keys: ModelKeys, raw: bytes, key: str | None = None) -> VersionState:
        """The (cached) state of the version a ``current``/pointer value names."""
        version, publish_id, _ = parse_pointer(raw, key or keys.current)
        cache_key = f"{keys.tag}|{version}:{publish_id}"
        st = self._states.get(cache_key)
        if st is None:
            st = load_version_state(self._bulk, keys, raw, key)
            with self._lock:
                if len(self._states) >= 16:
                    self._states.pop(next(iter(self._states)))
                self._states[cache_key] = st
        return st

    def _current_state(self, model: str) -> VersionState:
        """The state of the version ``current`` names now (one round trip once cached)."""
        import redis

        keys = self._model_keys(model)
        try:
            raw = self._send(keys, BUCKETS, [("GET", keys.current)])[0]
        except redis.ResponseError as err:
            raise LayoutError(f"{keys.current} is not a string key ({err})") from None
        if raw is None:
            raise UnknownModelError(f"model {model!r} has no published version in namespace "
                                    f"{self.namespace!r} at {self._where} ({keys.current} does "
                                    "not exist)")
        st = self._state(keys, raw)
        self._current[model] = st
        return st

    def _check_pointers(self, st: VersionState, pointers: list) -> None:
        """Return when every pointer names ``st``; else follow the newest one (the version
        lookups use from now on) and raise :class:`Vanished` to ask again, or
        :class:`_Straddles` when the pointers name different versions (a pointer move in
        progress) or some are missing."""
        if all(map(st.names, pointers)):
            return
        keys = st.keys
        if any(p is None for p in pointers):
            self._current_state(keys.model)   # UnknownModelError when nothing is published
            raise _Straddles(st.version)
        where = f"a bucket pointer of {keys.tag}"
        parsed = [(parse_pointer(p, where)[2], p) for p in pointers]
        newest = max(parsed)[1]
        self._current[keys.model] = self._state(keys, newest, where)
        if len({p[:p.rindex(b":")] for _, p in parsed}) > 1:
            raise _Straddles(st.version)
        raise Vanished(st.version)

    def _resolve_once(self, model: str, users: list, k: int) -> list[Recommendation]:
        st = self._current.get(model)
        if st is None or not st.per_key:
            st = self._current_state(model)
        if not st.per_key:
            return [self._global(st, u, k) for u in users]
        if None in users:   # no user given: the version's list for everyone (the fallback)
            known = [i for i, u in enumerate(users) if u is not None]
            answers = self._resolve_once(model, [users[i] for i in known], k) if known else []
            source = "fallback" if st.global_items is not None else "missing"
            out = [Recommendation(model, None, st.global_answer(k), st.version, source)
                   for _ in users]
            for i, rec in zip(known, answers):
                out[i] = rec
            return out
        names = [key_of(u) for u in users]
        buckets = [bucket_of(x) for x in names]
        prefixes = st.topk_prefixes
        pointers, lists, _ = self._bucket_mget(
            st, buckets, [prefixes[b] + x for b, x in zip(buckets, names)])
        self._check_pointers(st, pointers)
        out: list = [None] * len(users)
        need = []
        for i, value in enumerate(lists):
            if value is not None and (k <= st.top_k or not st.rank):
                out[i] = Recommendation(model, users[i], _pairs(st, value, k, names[i]),
                                        st.version, st.sources["precomputed"])
            else:
                need.append(i)
        if need:
            self._answer_rest(st, users, names, buckets, lists, need, k, out)
        return out

    def _answer_rest(self, st: VersionState, users, names, buckets, lists, need, k,
                     out) -> None:
        """On-demand scoring or fallback for ``need``; one more round trip."""
        extra = [(buckets[i], ("EXISTS", st.topk_prefixes[buckets[i]] + names[i]))
                 for i in need if lists[i] is None]
        if st.rank:
            rest = [buckets[i] for i in need]
            pointers, factors, exists = self._bucket_mget(
                st, rest, [n for i, b in zip(need, rest) for n in
                           (st.user_prefixes[b] + names[i], st.seen_prefixes[b] + names[i])],
                2, extra)
            self._check_pointers(st, pointers)
        else:
            exists = self._send_many(st.keys, extra) if extra else []
        exists = iter(exists)
        for j, i in enumerate(need):
            if lists[i] is None and next(exists):
                raise LayoutError(f"{st.topk_prefixes[buckets[i]] + names[i]} exists but is "
                                  "not a string (a foreign key under the namespace?)")
            u_raw = factors[2 * j] if st.rank else None
            if u_raw is not None:
                items = self._on_demand(st, u_raw, factors[2 * j + 1], k, names[i], buckets[i])
                out[i] = Recommendation(st.model, users[i], items, st.version,
                                        st.sources["on_demand"])
            elif lists[i] is not None:
                out[i] = Recommendation(st.model, users[i], _pairs(st, lists[i], k, names[i]),
                                        st.version, st.sources["precomputed"])
            else:
                source = "fallback" if st.global_items is not None else "missing"
                out[i] = Recommendation(st.model, users[i], st.global_answer(k), st.version,
                                        source)

    def _on_demand(self, st: VersionState, u_raw: bytes, seen_raw, k: int, name: str,
                   bucket: int) -> list:
        V, b = load_factors(self._bulk, st)
        u = unpack_f32(u_raw, st.user_prefixes[bucket] + name)
        if u.shape != (st.rank,):
            raise LayoutError(f"{st.user_prefixes[bucket] + name} holds {u.size} floats, the "
                              f"version has rank {st.rank}")
        scores = V @ u if b is None else V @ u + b
        seen = None
        if seen_raw is not None:
            seen = unpack_i32(seen_raw, st.seen_prefixes[bucket] + name)
            if len(seen) and (seen.min() < 0 or seen.max() >= st.n_items):
                raise LayoutError(f"{st.seen_prefixes[bucket] + name} lists an item index "
                                  f"outside the version's {st.n_items} items")
        idx, sc = topk_of_scores(scores, k, exclude=seen)
        ids = st.item_ids
        return [(ids[i], s) for i, s in zip(idx.tolist(), sc.astype(np.float32).tolist())]

    def _global(self, st: VersionState, user, k: int) -> Recommendation:
        if st.global_items is None:
            return Recommendation(st.model, user, [], st.version, "missing")
        return Recommendation(st.model, user, st.global_answer(k), st.version,
                              st.sources["global"])

    # ------------------------------------------------------------------ failure policy
    def _remember(self, model: str, key: str, rec: Recommendation) -> None:
        last = self._last
        last.pop((model, key), None)
        last[(model, key)] = rec
        if len(last) > self._last_size:
            try:  # the oldest entry; another thread may resize the dict meanwhile
                last.pop(next(iter(last)), None)
            except (RuntimeError, StopIteration):
                pass

    def _went_down(self, err, again: bool) -> str:
        """Start the retry interval (on a new failure) and say what happened."""
        if again:
            self._last_error = err
            self._down_until = time.monotonic() + self.retry_interval
        return (f"Redis at {self._where} is unavailable ({type(err).__name__}: {err}); "
                f"next attempt in up to {self.retry_interval:g} s")

    def _failed(self, model: str, users: list, k: int, err, again: bool = True) -> list:
        msg = self._went_down(err, again)
        if self._last is None:
            raise RedisUnavailable(msg) from err
        st = self._current.get(model)
        out = []
        for u in users:
            rec = self._last.get((model, key_of(u))) if u is not None else None
            if rec is not None:
                out.append(replace(rec, items=rec.items[:k], stale=True))
            elif st is not None:
                source = (st.sources["global"] if not st.per_key else
                          "fallback" if st.global_items is not None else "missing")
                out.append(Recommendation(model, u, st.global_answer(k), st.version, source,
                                          stale=True))
            else:
                raise RedisUnavailable(msg + f"; and no last-known answer for model {model!r}")
        return out


class _Down(Exception):
    def __init__(self, err):
        super().__init__(str(err))
        self.err = err


class _Straddles(Vanished):
    """A batch's bucket pointers name different versions (or some are missing): a pointer
    move is under way; ask again shortly."""


def _describe(client) -> str:
    """Where a given client connects, for messages (no password)."""
    if is_cluster(client):
        node = client.get_default_node()
        return f"cluster node {node.host}:{node.port}" if node else "a cluster"
    kw = client.connection_pool.connection_kwargs
    return kw.get("path") or f"{kw.get('host')}:{kw.get('port')}"
