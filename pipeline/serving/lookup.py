"""Online top-K lookups from the versions :func:`pipeline.serving.publish.publish` wrote to Redis.

A user's answer takes one round trip from their precomputed list (``MGET`` of the bucket
pointer and the list: :mod:`~pipeline.serving.list_reads` has why no answer mixes versions),
or one more when they are scored on demand from their factor; unknown users or queries get
the version's fallback list (``source == "fallback"``). Candidates given in the request
(:meth:`TopK.rank`, :meth:`TopK.predict_rating`) are scored in process by the version's
:class:`~pipeline.serving.scorers.Scorer`: one round trip (``GET current``) per answer.

When Redis is down or slower than ``timeout``: ``on_error="raise"`` raises
:class:`RedisUnavailable`; ``on_error="last_known"`` answers from an in-process cache of the
last answers (``stale=True``). A circuit breaker (:class:`~pipeline.serving.fallback.Breaker`)
decides when lookups stop trying: one failed lookup among successes fails alone, but when half
or more of the recent round trips fail, or the connection is refused, the client does not
touch Redis for ``retry_interval`` seconds, then lets one lookup probe it. On a cluster, a
``MOVED`` reply or a node that stopped answering first refreshes the slot map and tries once
more (:mod:`~pipeline.serving.transport`).

:class:`TopK` is the front: it resolves the version (:mod:`~pipeline.serving.resolver`), fetches
the values (:mod:`~pipeline.serving.list_reads`, :mod:`~pipeline.serving.version_cache`) and
hands them to pure builders (:mod:`~pipeline.serving.answer_builders`,
:mod:`~pipeline.serving.item_queries`); failures go to the policy
(:mod:`~pipeline.serving.fallback`), answers are counted (:mod:`~pipeline.serving.answers`).
"""

from __future__ import annotations

import numpy as np

from pipeline.serving import answer_builders as build
from pipeline.serving import explain as explained
from pipeline.serving import item_queries as queries
from pipeline.serving.answers import AnswerCounts, ModelInfo, Prediction, Recommendation
from pipeline.serving.fallback import Breaker, Guard, RedisUnavailable, failure_policy
from pipeline.serving.item_filter import ItemFilter
from pipeline.serving.layout import LayoutError, UnknownModelError
from pipeline.serving.list_reads import ListReads
from pipeline.serving.resolver import VersionResolver
from pipeline.serving.transport import Transport
from pipeline.serving.version_cache import VersionState, load_scorer
from pipeline.serving.version_listing import VersionInfo, current_version, fallback_share

__all__ = ["TopK", "Recommendation", "Prediction", "ModelInfo", "RedisUnavailable",
           "LayoutError", "UnknownModelError"]


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
    timeout, load_timeout : float
        Seconds to wait for Redis on a lookup, and for reading a new version's item
        ids/factors (bigger values), before the policy applies.
    retry_interval : float
        Seconds the circuit breaker stays open (lookups answered by ``on_error`` without
        touching Redis) before one lookup probes Redis again; the probe's success closes it.
    breaker_window, breaker_seconds, breaker_failure_rate, breaker_min_calls : int, float
        When the breaker opens: over the last ``breaker_window`` round trips (20) of the last
        ``breaker_seconds`` (10 s), at least ``breaker_min_calls`` (5) of them, a share of
        ``breaker_failure_rate`` (0.5) or more failed. A refused connection (a server down or
        restarting) opens it at once. So one timeout among successes fails that lookup alone
        (by ``on_error``), and the lookups after it try Redis as usual; a server that stops
        answering is given up on after a few failed lookups, which then cost nothing.
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
    ...         info = topk.model_info("movies")
    >>> ann.items, ann.source, ann.version
    ([(11, 2.0), (12, 1.0)], 'precomputed', 1)
    >>> [(r.items, r.source) for r in answers]
    [([(10, -0.5), (12, -1.0)], 'precomputed'), ([(10, 0.0), (11, 0.0)], 'fallback')]
    >>> info.version, info.kind
    (1, 'user_item')
    """

    def __init__(self, redis, *, namespace: str = "rankstream", on_error: str = "raise",
                 timeout: float = 0.1, load_timeout: float = 10.0, retry_interval: float = 0.5,
                 breaker_window: int = 20, breaker_seconds: float = 10.0,
                 breaker_failure_rate: float = 0.5, breaker_min_calls: int = 5,
                 last_known_size: int = 100_000):
        self.policy = failure_policy(on_error, last_known_size)
        self.breaker = Breaker(retry_interval, window=breaker_window,
                               window_seconds=breaker_seconds,
                               failure_rate=breaker_failure_rate, min_calls=breaker_min_calls)
        self.transport = Transport(redis, timeout=timeout, load_timeout=load_timeout,
                                   breaker=self.breaker)
        self.versions = VersionResolver(self.transport, namespace)
        self.guard = Guard(self.policy, self.breaker, self.versions, self.transport.where)
        self.lists = ListReads(self.transport, self.versions, self.guard)
        self.counts = AnswerCounts(self.transport.client,
                                   lambda model: self.versions.keys(model).lookups)
        self.namespace, self.on_error = namespace, on_error

    @classmethod
    def from_settings(cls, settings, **kwargs) -> TopK:
        """A client for ``settings.redis_url`` with the settings' namespace, timeout and
        failure policy (``RANKSTREAM_REDIS_*``); ``kwargs`` override.

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
        return self.breaker.retry_interval

    def close(self) -> None:
        """Flush the answer counts and close the connections of this client."""
        if self.counts.enabled and self.counts.unflushed and not self.breaker.active:
            self.counts.flush()
        self.transport.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    # ------------------------------------------------------------------ answers
    def recommend(self, model: str, user=None, k: int = 10, *, exclude=None,
                  allow=None) -> Recommendation:
        """Top ``k`` (item id, score) for ``user``; ``None``: the model's list for everyone
        (a global-list model's list, or a per-user model's fallback list). ``exclude`` and
        ``allow`` filter the items (:mod:`~pipeline.serving.item_filter`): the answer still
        holds ``k`` items whenever ``k`` eligible items exist; ``k`` at most ``MAX_K``, as the
        API and the CLI take."""
        build.check_k(k)
        if exclude is None and allow is None:
            rec = self.lists.one(model, user, k)
        else:
            rec = self.lists.filtered(model, [user], k, exclude, allow)[0]
        self.counts.add(model, rec)
        return rec

    def recommend_many(self, model: str, users, k: int = 10, *, exclude=None,
                       allow=None) -> list[Recommendation]:
        """:meth:`recommend` for many users in one round trip (all from one version); the
        filters apply to every user."""
        build.check_k(k)
        if exclude is None and allow is None:
            out = self.lists.many(model, users, k)
        else:
            out = self.lists.filtered(model, list(users), k, exclude, allow) if users else []
        for rec in out:
            self.counts.add(model, rec)
        return out

    def similar(self, model: str, item, k: int = 10, *, exclude=None,
                allow=None) -> Recommendation:
        """The ``k`` items most like ``item``: cosine similarity of the version's item factors,
        exact, on demand (``user`` of the answer is the item asked about)."""
        build.check_k(k)

        def attempt():
            st = self.versions.current_state(model)
            return queries.similar(st, self.lists.factors(st), item, k,
                                   ItemFilter(st, exclude, allow))

        rec = self.guard.run(model, attempt, self.guard.no_answer)
        self.counts.add(model, rec)
        return rec

    def fold_in(self, model: str, items, k: int = 10, *, comparisons=None, exclude=None,
                allow=None) -> Recommendation:
        """Recommendations for a user the version does not know, from ``items`` they met
        and/or ``comparisons`` ((winner, loser) item ids), by the version's own fold-in
        (:mod:`solvers.fold_in`); their items are left out. A version without a fold-in
        answers its fallback list (``source == "fallback"``)."""
        build.check_k(k)

        def attempt():
            st = self.versions.current_state(model)
            met = queries.known_items(st, items)
            pairs = queries.known_pairs(st, comparisons)
            filt = ItemFilter(st, exclude, allow, also_excluded=np.union1d(met, pairs.ravel()))
            if not st.fold_in or not st.rank or not (len(met) or len(pairs)):
                return build.everyone_answer(st, None, self.lists.global_items(st, k, filt))
            return queries.fold_in(st, self.lists.factors(st), met, pairs, k, filt)

        rec = self.guard.run(model, attempt, self.guard.no_answer)
        self.counts.add(model, rec)
        return rec

    def explain(self, model: str, user, item, k: int = 10) -> explained.Explanation:
        """Why ``user`` gets ``item``: the served score split into one term per item they met
        (or comparison), the ``k`` largest listed, exactly (terms + bias + residual = score;
        :mod:`~pipeline.serving.explain` has the math per shape). Unknown user:
        :class:`~pipeline.serving.explain.UnknownUserError`; a version without per-user state
        answers with a ``note`` instead of terms."""
        build.check_k(k)

        def attempt():
            st = self.versions.current_state(model)
            return explained.explain(self.lists, st, user, item, k)

        return self.guard.run(model, attempt, self.guard.no_answer)

    def rank(self, model: str, candidates, k: int = 10, query=None) -> Recommendation:
        """The top ``k`` of ``candidates`` (``(id, x)`` pairs; ``x`` a features list or
        ``{index: value}`` map, a text, or ``{"features": ..., "text": ...}``) by the current
        version's model: ``source == "scored"``; ``query`` is recorded in the answer."""
        build.check_k(k)
        candidates = build.checked_candidates(candidates)
        st, stale = self._scorer_state(model)
        rec = build.ranked_candidates(st, query, candidates, k, stale)
        self.counts.add(model, rec)
        return rec

    def predict_rating(self, model: str, features=None, text=None) -> Prediction:
        """An ordinal model's rating of one item described by ``features`` (list or
        ``{index: value}`` map, as in events) and/or ``text``."""
        if features is None and text is None:
            raise ValueError("predict_rating needs features or text, got neither")
        st, stale = self._scorer_state(model)
        return build.rating(st, features, text, stale)

    def stats(self) -> dict:
        """``{model: {source: count}}`` of this client's answers (``stale``: last-known)."""
        return self.counts.stats()

    # ------------------------------------------------------------------ models
    def ping(self) -> None:
        """Raise when Redis does not answer."""
        self.transport.client.ping()

    def served_version(self, model: str) -> VersionInfo | None:
        """The version ``model`` is served from, with its meta; None when none is published."""
        return current_version(model, self.transport.client, namespace=self.namespace)

    def model_info(self, model: str) -> ModelInfo:
        """The served version of ``model``: its meta, age, and the share of its lookups (all
        clients together) answered from the fallback list."""
        current = self.served_version(model)
        if current is None:
            return ModelInfo(model)
        share, total = fallback_share(model, self.transport.client, current.version,
                                      namespace=self.namespace)
        return ModelInfo.of(current, model, total, share)

    # ------------------------------------------------------------------ scorers
    def _scorer_state(self, model: str) -> tuple[VersionState, bool]:
        """(current version with its scorer loaded, stale)."""
        def attempt():
            st = self.versions.current_state(model)
            load_scorer(self.transport.bulk, st)
            return st, False

        return self.guard.run(model, attempt,
                              lambda err, again: (self.guard.scorer_state(model, err, again),
                                                  True))
