"""What lookups do when Redis is down or slower than the timeout: the failure policy
(``on_error``) and the retry interval after a failure.

``"raise"`` (:class:`RaisePolicy`) raises :class:`RedisUnavailable`. ``"last_known"``
(:class:`LastKnownPolicy`) remembers the last answers and answers from them (``stale=True``);
users never answered get the last-known version's fallback list, and a re-ranking or rating
call is answered by the last version's cached model. After a failure no lookup touches Redis
for ``retry_interval`` seconds (:class:`Outage`).
"""

from __future__ import annotations

import time
from dataclasses import replace

from pipeline.serving.answers import Recommendation
from pipeline.serving.layout import key_of
from pipeline.settings import ON_ERROR


class RedisUnavailable(ConnectionError):
    """Redis did not answer (down, refused, or slower than the timeout)."""


class Outage:
    """Since the last failure: when lookups may touch Redis again, and the error.

    >>> outage = Outage(retry_interval=60)
    >>> outage.active, outage.begin(OSError("refused")), outage.active, outage.waiting()
    (False, None, True, True)
    """

    def __init__(self, retry_interval: float):
        self.retry_interval = float(retry_interval)
        self.until: float | None = None
        self.error: Exception | None = None

    @property
    def active(self) -> bool:
        """A failure happened and no lookup has succeeded since (fast paths step aside)."""
        return self.until is not None

    def waiting(self) -> bool:
        """Still inside the retry interval."""
        return self.until is not None and time.monotonic() < self.until

    def begin(self, err: Exception) -> None:
        self.error = err
        self.until = time.monotonic() + self.retry_interval

    def clear(self) -> None:
        self.until = None


class RaisePolicy:
    """``on_error="raise"``: every failure is a :class:`RedisUnavailable`."""

    remembers = False

    def remember(self, model: str, key: str, rec: Recommendation) -> None:
        pass

    def answers(self, model: str, users: list, k: int, st, message: str, err) -> list:
        raise RedisUnavailable(message) from err

    def scorer_state(self, model: str, st, message: str, err):
        raise RedisUnavailable(message) from err


class LastKnownPolicy(RaisePolicy):
    """``on_error="last_known"``: the last ``size`` answers, answered again when Redis is
    unavailable."""

    remembers = True

    def __init__(self, size: int):
        self.size = int(size)
        self.last: dict = {}

    def remember(self, model: str, key: str, rec: Recommendation) -> None:
        last = self.last
        last.pop((model, key), None)
        last[(model, key)] = rec
        if len(last) > self.size:
            try:  # the oldest entry; another thread may resize the dict meanwhile
                last.pop(next(iter(last)), None)
            except (RuntimeError, StopIteration):
                pass

    def answers(self, model: str, users: list, k: int, st, message: str, err) -> list:
        """Each user's last answer, else the last-known version's list for everyone."""
        out = []
        for u in users:
            rec = self.last.get((model, key_of(u))) if u is not None else None
            if rec is not None:
                out.append(replace(rec, items=rec.items[:k], stale=True))
            elif st is not None:
                source = (st.sources["global"] if not st.per_key else
                          "fallback" if st.global_items is not None else "missing")
                out.append(Recommendation(model, u, st.global_answer(k), st.version, source,
                                          stale=True))
            else:
                raise RedisUnavailable(message + f"; and no last-known answer for model "
                                       f"{model!r}") from err
        return out

    def scorer_state(self, model: str, st, message: str, err):
        """The last version with its model cached, or :class:`RedisUnavailable`."""
        if st is None or st.scorer is None:
            raise RedisUnavailable(message + f"; and no cached model for {model!r}") from err
        return st


def failure_policy(on_error: str, last_known_size: int) -> RaisePolicy:
    """The policy object of an ``on_error`` setting."""
    if on_error not in ON_ERROR:
        raise ValueError(f"on_error is {on_error!r}, expected 'raise' or 'last_known'")
    return LastKnownPolicy(last_known_size) if on_error == "last_known" else RaisePolicy()


class Guard:
    """How a lookup that touches Redis fails: ``run(model, attempt, failed)`` runs
    ``attempt()`` through the resolver's re-reads of vanished versions, and ``failed(err,
    again)`` instead when Redis is down (``again``: a new failure, which starts the retry
    interval, not the interval of an old one). The ``failed`` callables here answer by the
    policy: :meth:`answers`, :meth:`scorer_state`, :meth:`no_answer`."""

    def __init__(self, policy: RaisePolicy, outage: Outage, resolver, where: str):
        self.policy, self.outage, self.resolver, self.where = policy, outage, resolver, where

    def run(self, model: str, attempt, failed):
        from pipeline.serving.transport import Down

        if self.outage.active:
            if self.outage.waiting():
                return failed(self.outage.error, False)
            self.outage.clear()
        try:
            return self.resolver.retrying(model, attempt)
        except Down as down:
            return failed(down.err, True)
        except Exception as err:
            import redis

            if isinstance(err, (redis.ConnectionError, redis.TimeoutError)) and not isinstance(
                    err, redis.AuthenticationError):
                return failed(err, True)
            raise

    def went_down(self, err, again: bool) -> str:
        """Start the retry interval (on a new failure) and say what happened and what to do.
        No promise of a retry: a one-shot command (``rankstream recommend``) exits after it,
        and a long-lived client touches Redis again only when asked after the interval."""
        if again:
            self.outage.begin(err)
        return (f"Redis at {self.where} is unavailable ({type(err).__name__}: {err}); check "
                "that it is running and reachable at that address, then try again")

    def answers(self, model: str, users: list, k: int, err, again: bool = True) -> list:
        """The policy's answers for ``users`` (last-known ones, or RedisUnavailable)."""
        message = self.went_down(err, again)
        return self.policy.answers(model, users, k, self.resolver.current.get(model), message,
                                   err)

    def scorer_state(self, model: str, err, again: bool):
        """The last version with its scorer cached (last-known), or RedisUnavailable."""
        message = self.went_down(err, again)
        return self.policy.scorer_state(model, self.resolver.current.get(model), message, err)

    def no_answer(self, err, again: bool):
        """For answers without a last-known form (similar items, fold-ins): raise."""
        raise RedisUnavailable(self.went_down(err, again)) from err
