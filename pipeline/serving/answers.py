"""What a lookup answers (:class:`Recommendation`, :class:`Prediction`), what the front says
of a model's served version (:class:`ModelInfo`), and how the answers are counted: per model,
version and source, in process (``TopK.stats()``) and, every ``COUNT_FLUSH`` seconds at most,
added to the model's ``lookups`` hash in Redis, where ``rankstream models`` reads the share of
fallback answers.
"""

from __future__ import annotations

import time
from collections import Counter
from dataclasses import dataclass

COUNT_FLUSH = 10.0  # seconds between flushes of the answer counts to Redis


@dataclass(slots=True)
class Recommendation:
    """One answer of :class:`~pipeline.serving.lookup.TopK`.

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
        ``"scored"`` (candidates given in the request, scored by the version's model),
        ``"fold_in"`` (a new user folded in from their items), ``"fresh"`` (the user's list or
        factor as the refresher rewrote it since the version was published, whatever the
        version serves). A version that serves something other than the trained model
        reports what for its stored lists (``precomputed``, ``global``): ``"trivial"`` (a
        trivial list: the model did not beat it), ``"challenger-NAME"`` or ``"blend-NAME"``
        (the gate's challenger won; the version's ``served_as``), and both for an answer made
        now: ``"blend-als:fold_in"``, ``"challenger-ease:on_demand"``, ``"trivial:scored"``.
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
    """One answer of ``TopK.predict_rating``: the rating, the continuous ranking score it
    comes with (higher is better), and the version that computed both."""

    model: str
    rating: int
    score: float
    version: int
    stale: bool = False


@dataclass(slots=True)
class ModelInfo:
    """What ``TopK.model_info`` says of a model's served version: its meta, its age in
    seconds since training (None when ``trained_at`` is not a time), and the lookups of it
    that clients counted, with the share answered from the fallback list (None before any).
    ``version`` is None when nothing is published (the other fields are then empty)."""

    model: str
    version: int | None = None
    algorithm: str = ""
    kind: str = ""
    served_as: str = "model"
    metrics: dict | None = None
    trained_at: str = ""
    age_seconds: float | None = None
    lookups: int = 0
    fallback_share: float | None = None

    @classmethod
    def of(cls, current, model: str, lookups: int, share: float | None) -> ModelInfo:
        """From a :class:`~pipeline.serving.version_listing.VersionInfo` and its counts."""
        from pipeline.serving.version_listing import age_seconds

        return cls(model, current.version, current.algorithm, current.kind,
                   current.served_as, current.metrics, current.trained_at,
                   age_seconds(current.trained_at), lookups, share)

    def to_dict(self) -> dict:
        """As JSON has it: ``{"model", "version": None}`` when nothing is published.

        >>> ModelInfo("movies").to_dict()
        {'model': 'movies', 'version': None}
        """
        if self.version is None:
            return {"model": self.model, "version": None}
        return {"model": self.model, "version": self.version, "algorithm": self.algorithm,
                "kind": self.kind, "served_as": self.served_as, "metrics": self.metrics,
                "trained_at": self.trained_at, "age_seconds": self.age_seconds,
                "lookups": self.lookups, "fallback_share": self.fallback_share}


class AnswerCounts:
    """Answers by ``(model, version, source)``; ``stale`` counts last-known answers.

    ``lookups_key(model)`` names the model's ``lookups`` hash; ``client`` is where it lives.

    >>> counts = AnswerCounts(client=None, lookups_key=str)
    >>> counts.add("movies", Recommendation("movies", "u", [], 3, "fallback"))
    >>> counts.stats()
    {'movies': {'fallback': 1}}
    """

    def __init__(self, client, lookups_key, every: float = COUNT_FLUSH):
        self.client, self.lookups_key, self.every = client, lookups_key, every
        self.total: Counter = Counter()
        self.unflushed: Counter = Counter()
        self.next_flush = time.monotonic() + every
        self.enabled = client is not None     # a replica that refuses writes turns it off

    def add(self, model: str, rec: Recommendation) -> None:
        key = (model, rec.version, "stale" if rec.stale else rec.source)
        self.total[key] += 1
        self.unflushed[key] += 1
        if self.enabled and time.monotonic() >= self.next_flush:
            self.flush()

    def stats(self) -> dict:
        """``{model: {source: count}}``."""
        out: dict = {}
        for (model, _, source), n in self.total.items():
            out.setdefault(model, {}).setdefault(source, 0)
            out[model][source] += n
        return out

    def flush(self) -> None:
        """Add the counts since the last flush to the models' ``lookups`` hashes (one round
        trip). Best effort: a replica that refuses writes turns counting to Redis off, a
        failure loses only these counts."""
        import redis

        self.next_flush = time.monotonic() + self.every
        counts, self.unflushed = self.unflushed, Counter()
        pipe = self.client.pipeline(transaction=False)
        for (model, version, source), n in counts.items():
            pipe.hincrby(self.lookups_key(model), f"{version}:{source}", n)
        try:
            pipe.execute()
        except redis.ResponseError:       # READONLY replica, NOPERM: stop trying
            self.enabled = False
        except (redis.RedisError, OSError):
            pass
