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

:class:`TopK` is the front of four parts, each its own module: the connections and round trips
(:mod:`~pipeline.serving.transport`), which version to read (:mod:`~pipeline.serving.resolver`),
the failure policy (:mod:`~pipeline.serving.fallback`) and the answer counts
(:mod:`~pipeline.serving.answers`).

Examples
--------
>>> topk = TopK("redis://127.0.0.1:6379/0", namespace="rankstream")  # doctest: +SKIP
>>> rec = topk.recommend("movies", "alice", k=3)  # doctest: +SKIP
>>> rec.items, rec.source, rec.version  # doctest: +SKIP
([(1193, 4.2), (661, 3.9), (914, 3.7)], 'precomputed', 7)
"""

from __future__ import annotations

import numpy as np

from pipeline.serving import item_queries as queries
from pipeline.serving.answers import AnswerCounts, Prediction, Recommendation
from pipeline.serving.fallback import Outage, RedisUnavailable, failure_policy
from pipeline.serving.item_filter import ItemFilter
from pipeline.serving.layout import (
    BUCKETS,
    LayoutError,
    UnknownModelError,
    bucket_of,
    key_of,
    pair_struct,
    unpack_f32,
    unpack_i32,
)
from pipeline.serving.resolver import VersionResolver
from pipeline.serving.transport import Down, Transport
from pipeline.serving.version_cache import (
    VersionState,
    load_factors,
    load_global_scores,
    load_scorer,
)
from solvers.topk import topk_of_scores

__all__ = ["TopK", "Recommendation", "Prediction", "RedisUnavailable", "LayoutError",
           "UnknownModelError"]

_STRUCTS = [pair_struct(n) for n in range(257)]


def _check_k(k: int) -> None:
    if k < 0:
        raise ValueError(f"k is {k}, it must be >= 0")


def _fallback_source(st: VersionState) -> str:
    return "fallback" if st.global_items is not None else "missing"


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
        self.policy = failure_policy(on_error, last_known_size)
        self.transport = Transport(redis, timeout=timeout, load_timeout=load_timeout)
        self.versions = VersionResolver(self.transport, namespace)
        self.outage = Outage(retry_interval)
        self.counts = AnswerCounts(self.transport.client,
                                   lambda model: self.versions.keys(model).lookups)
        self.namespace = namespace
        self.on_error = on_error

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

    @property
    def retry_interval(self) -> float:
        return self.outage.retry_interval

    def close(self) -> None:
        """Flush the answer counts and close the connections of this client."""
        if self.counts.enabled and self.counts.unflushed and not self.outage.active:
            self.counts.flush()
        self.transport.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    # ------------------------------------------------------------------ public API
    def recommend(self, model: str, user=None, k: int = 10, *, exclude=None,
                  allow=None) -> Recommendation:
        """Top ``k`` (item id, score) for ``user``; ``None``: the model's list for everyone
        (a global-list model's list, or a per-user model's fallback list).

        ``exclude`` and ``allow`` filter the items (:mod:`~pipeline.serving.item_filter`):
        the answer still holds ``k`` items whenever ``k`` eligible items exist.

        Examples
        --------
        >>> topk.recommend("movies", 42, k=2).items  # doctest: +SKIP
        [(1193, 4.25), (661, 3.5)]
        >>> topk.recommend("movies", 42, k=2, exclude=[1193]).items  # doctest: +SKIP
        [(661, 3.5), (914, 3.25)]
        """
        if exclude is None and allow is None:
            rec = self._recommend(model, user, k)
        else:
            rec = self._filtered(model, [user], k, exclude, allow)[0]
        self.counts.add(model, rec)
        return rec

    def recommend_many(self, model: str, users, k: int = 10, *, exclude=None,
                       allow=None) -> list[Recommendation]:
        """:meth:`recommend` for many users in one round trip (all from one version); the
        filters apply to every user.

        Examples
        --------
        >>> [r.source for r in topk.recommend_many("movies", [1, 2, 3])]  # doctest: +SKIP
        ['precomputed', 'precomputed', 'fallback']
        """
        if exclude is None and allow is None:
            out = self._recommend_many(model, users, k)
        else:
            out = self._filtered(model, list(users), k, exclude, allow) if users else []
        for rec in out:
            self.counts.add(model, rec)
        return out

    def similar(self, model: str, item, k: int = 10, *, exclude=None,
                allow=None) -> Recommendation:
        """The ``k`` items most like ``item``: cosine similarity of the version's item factors,
        exact, on demand (``user`` of the answer is the item asked about).

        Examples
        --------
        >>> topk.similar("movies", 1193, k=2).items  # doctest: +SKIP
        [(661, 0.93), (914, 0.91)]
        """
        _check_k(k)

        def attempt():
            st = self.versions.current_state(model)
            return queries.similar(st, self._factors(st), item, k,
                                   ItemFilter(st, exclude, allow))

        rec = self._guarded(model, attempt, lambda err, again: self._no_answer(err, again))
        self.counts.add(model, rec)
        return rec

    def fold_in(self, model: str, items, k: int = 10, *, comparisons=None, exclude=None,
                allow=None) -> Recommendation:
        """Recommendations for a user the version does not know, from ``items`` they met
        and/or ``comparisons`` ((winner, loser) item ids): their factor is solved against the
        version's item factors by the problem the model was trained with
        (:mod:`solvers.fold_in`); their items are left out of the answer. A version without
        a fold-in answers its fallback list (``source == "fallback"``).

        Examples
        --------
        >>> topk.fold_in("movies", [1193, 661, 914], k=2).source  # doctest: +SKIP
        'fold_in'
        """
        _check_k(k)

        def attempt():
            st = self.versions.current_state(model)
            met = queries.known_items(st, items)
            pairs = queries.known_pairs(st, comparisons)
            filt = ItemFilter(st, exclude, allow, also_excluded=np.union1d(met, pairs.ravel()))
            if not st.fold_in or not st.rank or not (len(met) or len(pairs)):
                return Recommendation(model, None, self._ranked_global(st, k, filt),
                                      st.version, _fallback_source(st))
            return queries.fold_in(st, self._factors(st), met, pairs, k, filt)

        rec = self._guarded(model, attempt, lambda err, again: self._no_answer(err, again))
        self.counts.add(model, rec)
        return rec

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
        _check_k(k)
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
        self.counts.add(model, rec)
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

    def stats(self) -> dict:
        """How this client's answers came about, per model: ``{model: {source: count}}``
        (sources as in :class:`Recommendation`; ``stale`` counts last-known answers).

        Examples
        --------
        >>> topk.stats()  # doctest: +SKIP
        {'movies': {'precomputed': 9812, 'fallback': 188}}
        """
        return self.counts.stats()

    # ------------------------------------------------------------------ fast paths
    def _recommend(self, model: str, user, k: int) -> Recommendation:
        """One round trip for a user with a precomputed list of the version last seen."""
        st = self.versions.current.get(model)
        if st is not None and not self.outage.active:
            if st.per_key and user is not None and 0 <= k and (k <= st.top_k or not st.rank):
                key = user if type(user) is str else key_of(user)
                b = bucket_of(key)
                try:
                    ptr, value = self.transport.send(st.keys, b, [
                        ("MGET", st.pointer_keys[b], st.topk_prefixes[b] + key)])[0]
                except Down as down:
                    return self._failed(model, [user], k, down.err)[0]
                if value is not None and ptr is not None and ptr.startswith(st.pointer_prefix):
                    rec = Recommendation(model, user, _pairs(st, value, k, key), st.version,
                                         st.sources["precomputed"])
                    if self.policy.remembers:
                        self.policy.remember(model, key, rec)
                    return rec
            elif not st.per_key:
                try:
                    cur = self.transport.send(st.keys, BUCKETS, [("GET", st.keys.current)])[0]
                except Down as down:
                    return self._failed(model, [user], k, down.err)[0]
                if st.names(cur):
                    return self._global(st, user, k)
        return self._resolve(model, [user], k)[0]

    def _recommend_many(self, model: str, users, k: int) -> list[Recommendation]:
        """One round trip per node for a batch of users with precomputed lists."""
        users = list(users)
        st = self.versions.current.get(model)
        if not users:
            return []
        if (st is not None and st.per_key and not self.outage.active and 0 <= k
                and (k <= st.top_k or not st.rank) and None not in users):
            keys = [u if type(u) is str else key_of(u) for u in users]
            buckets = [bucket_of(x) for x in keys]
            prefixes = st.topk_prefixes
            try:
                pointers, values, _ = self.transport.bucket_mget(
                    st, buckets, [prefixes[b] + x for b, x in zip(buckets, keys)])
            except Down as down:
                return self._failed(model, users, k, down.err)
            first = pointers[0]       # synced pointers are equal bytes: one C-level count
            if ((first is not None and first.startswith(st.pointer_prefix)
                 and pointers.count(first) == len(pointers) or all(map(st.names, pointers)))
                    and None not in values):
                source = st.sources["precomputed"]
                out = [Recommendation(model, u, _pairs(st, v, k, x), st.version, source)
                       for u, x, v in zip(users, keys, values)]
                if self.policy.remembers:
                    for x, rec in zip(keys, out):
                        self.policy.remember(model, x, rec)
                return out
        return self._resolve(model, users, k)

    # ------------------------------------------------------------------ filters
    def _filtered(self, model: str, users: list, k: int, exclude, allow) -> list:
        """Filtered answers for ``users`` from one version (last-known answers, filtered,
        when Redis is down)."""
        _check_k(k)

        def attempt():
            st = self.versions.current_state(model)
            return self._resolve_once(model, users, k, ItemFilter(st, exclude, allow))

        def failed(err, again):
            out = self._failed(model, users, max(k, 1000), err, again)
            drop, only = set(exclude or ()), None if allow is None else set(allow)
            for rec in out:
                rec.items = [p for p in rec.items if p[0] not in drop and str(p[0]) not in drop
                             and (only is None or p[0] in only or str(p[0]) in only)][:k]
            return out

        return self._guarded(model, attempt, failed)

    def _factors(self, st: VersionState):
        return load_factors(self.transport.bulk, st)

    def _ranked_global(self, st: VersionState, k: int, filt: ItemFilter | None) -> list:
        """The first ``k`` of the global list (a global-list model's, or the fallback) that
        ``filt`` lets through; when the stored list runs short of them, every eligible item
        ranked by the per-item global scores."""
        if st.global_items is None:
            return []
        listed = st.global_items if filt is None else filt.keep(st.global_items)
        if len(listed) >= k or len(st.global_items) < st.top_k:
            return listed[:k]
        scores = load_global_scores(self.transport.bulk, st)
        if scores is None:    # published before per-item scores were kept
            return listed[:k]
        idx, sc = topk_of_scores(scores if filt is None else filt.mask(scores), k)
        ids = st.item_ids
        return [(ids[i], s) for i, s in zip(idx.tolist(), sc.tolist())]

    def _no_answer(self, err, again: bool):
        """Similar items and fold-ins have no last-known answer: Redis down raises."""
        raise RedisUnavailable(self._went_down(err, again)) from err

    # ------------------------------------------------------------------ slow path
    def _resolve(self, model: str, users: list, k: int) -> list[Recommendation]:
        _check_k(k)

        def attempt():
            out = self._resolve_once(model, users, k)
            if self.policy.remembers:
                for u, rec in zip(users, out):
                    if rec.user is not None:
                        self.policy.remember(model, key_of(u), rec)
            return out

        return self._guarded(model, attempt,
                             lambda err, again: self._failed(model, users, k, err, again))

    def _scorer_state(self, model: str) -> tuple[VersionState, bool]:
        """(current version with its scorer loaded, stale): the last version's when Redis is
        down and the policy is last-known."""
        def attempt():
            st = self.versions.current_state(model)
            load_scorer(self.transport.bulk, st)
            return st, False

        def failed(err, again):
            message = self._went_down(err, again)
            return self.policy.scorer_state(model, self.versions.current.get(model), message,
                                            err), True

        return self._guarded(model, attempt, failed)

    def _guarded(self, model: str, attempt, failed):
        """``attempt()`` through the resolver's retries; ``failed(err, again)`` when Redis is
        down (``again``: a new failure, not the retry interval of an old one)."""
        if self.outage.active:
            if self.outage.waiting():
                return failed(self.outage.error, False)
            self.outage.clear()
        try:
            return self.versions.retrying(model, attempt)
        except Down as down:
            return failed(down.err, True)
        except Exception as err:
            import redis

            if isinstance(err, (redis.ConnectionError, redis.TimeoutError)) and not isinstance(
                    err, redis.AuthenticationError):
                return failed(err, True)
            raise

    def _resolve_once(self, model: str, users: list, k: int,
                      filt: ItemFilter | None = None) -> list[Recommendation]:
        st = self.versions.current.get(model)
        if st is None or not st.per_key:
            st = self.versions.current_state(model)
        if not st.per_key:
            return [self._global(st, u, k, filt) for u in users]
        if None in users:   # no user given: the version's list for everyone (the fallback)
            known = [i for i, u in enumerate(users) if u is not None]
            answers = (self._resolve_once(model, [users[i] for i in known], k, filt)
                       if known else [])
            out = [Recommendation(model, None, self._ranked_global(st, k, filt), st.version,
                                  _fallback_source(st)) for _ in users]
            for i, rec in zip(known, answers):
                out[i] = rec
            return out
        names = [key_of(u) for u in users]
        buckets = [bucket_of(x) for x in names]
        prefixes = st.topk_prefixes
        pointers, lists, _ = self.transport.bucket_mget(
            st, buckets, [prefixes[b] + x for b, x in zip(buckets, names)])
        self.versions.check_pointers(st, pointers)
        out: list = [None] * len(users)
        need = []
        for i, value in enumerate(lists):
            if value is not None and filt is not None:
                listed = _pairs(st, value, st.top_k, names[i])
                kept = filt.keep(listed)
                # short of k: the user's factor ranks every eligible item, unless the list
                # already holds every item the user has not met
                if len(kept) >= k or len(listed) < st.top_k or not st.rank:
                    out[i] = Recommendation(model, users[i], kept[:k], st.version,
                                            st.sources["precomputed"])
                    continue
            elif value is not None and (k <= st.top_k or not st.rank):
                out[i] = Recommendation(model, users[i], _pairs(st, value, k, names[i]),
                                        st.version, st.sources["precomputed"])
                continue
            need.append(i)
        if need:
            self._answer_rest(st, users, names, buckets, lists, need, k, out, filt)
        return out

    def _answer_rest(self, st: VersionState, users, names, buckets, lists, need, k,
                     out, filt: ItemFilter | None = None) -> None:
        """On-demand scoring or fallback for ``need``; one more round trip."""
        extra = [(buckets[i], ("EXISTS", st.topk_prefixes[buckets[i]] + names[i]))
                 for i in need if lists[i] is None]
        if st.rank:
            rest = [buckets[i] for i in need]
            pointers, factors, exists = self.transport.bucket_mget(
                st, rest, [n for i, b in zip(need, rest) for n in
                           (st.user_prefixes[b] + names[i], st.seen_prefixes[b] + names[i])],
                2, extra)
            self.versions.check_pointers(st, pointers)
        else:
            exists = self.transport.send_many(st.keys, extra) if extra else []
        exists = iter(exists)
        for j, i in enumerate(need):
            if lists[i] is None and next(exists):
                raise LayoutError(f"{st.topk_prefixes[buckets[i]] + names[i]} exists but is "
                                  "not a string (a foreign key under the namespace?)")
            u_raw = factors[2 * j] if st.rank else None
            if u_raw is not None:
                items = self._on_demand(st, u_raw, factors[2 * j + 1], k, names[i], buckets[i],
                                        filt)
                out[i] = Recommendation(st.model, users[i], items, st.version,
                                        st.sources["on_demand"])
            elif lists[i] is not None:
                listed = _pairs(st, lists[i], k, names[i])
                out[i] = Recommendation(st.model, users[i],
                                        listed if filt is None else filt.keep(listed)[:k],
                                        st.version, st.sources["precomputed"])
            else:
                out[i] = Recommendation(st.model, users[i], self._ranked_global(st, k, filt),
                                        st.version, _fallback_source(st))

    def _on_demand(self, st: VersionState, u_raw: bytes, seen_raw, k: int, name: str,
                   bucket: int, filt: ItemFilter | None = None) -> list:
        V, b = load_factors(self.transport.bulk, st)
        u = unpack_f32(u_raw, st.user_prefixes[bucket] + name)
        if u.shape != (st.rank,):
            raise LayoutError(f"{st.user_prefixes[bucket] + name} holds {u.size} floats, the "
                              f"version has rank {st.rank}")
        scores = V @ u if b is None else V @ u + b
        if filt is not None:
            scores = filt.mask(scores)
        seen = None
        if seen_raw is not None:
            seen = unpack_i32(seen_raw, st.seen_prefixes[bucket] + name)
            if len(seen) and (seen.min() < 0 or seen.max() >= st.n_items):
                raise LayoutError(f"{st.seen_prefixes[bucket] + name} lists an item index "
                                  f"outside the version's {st.n_items} items")
        idx, sc = topk_of_scores(scores, k, exclude=seen)
        ids = st.item_ids
        return [(ids[i], s) for i, s in zip(idx.tolist(), sc.astype(np.float32).tolist())]

    def _global(self, st: VersionState, user, k: int,
                filt: ItemFilter | None = None) -> Recommendation:
        if st.global_items is None:
            return Recommendation(st.model, user, [], st.version, "missing")
        return Recommendation(st.model, user, self._ranked_global(st, k, filt), st.version,
                              st.sources["global"])

    # ------------------------------------------------------------------ failure policy
    def _went_down(self, err, again: bool) -> str:
        """Start the retry interval (on a new failure) and say what happened."""
        if again:
            self.outage.begin(err)
        return (f"Redis at {self.transport.where} is unavailable ({type(err).__name__}: "
                f"{err}); next attempt in up to {self.outage.retry_interval:g} s")

    def _failed(self, model: str, users: list, k: int, err, again: bool = True) -> list:
        message = self._went_down(err, again)
        return self.policy.answers(model, users, k, self.versions.current.get(model), message,
                                   err)
