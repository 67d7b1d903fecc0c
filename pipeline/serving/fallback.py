"""What lookups do when Redis is down or slower than the timeout: the failure policy
(``on_error``) and the circuit breaker that decides when lookups stop touching Redis.

``"raise"`` (:class:`RaisePolicy`) raises :class:`RedisUnavailable`. ``"last_known"``
(:class:`LastKnownPolicy`) remembers the last answers and answers from them (``stale=True``);
users never answered get the last-known version's fallback list, and a re-ranking or rating
call is answered by the last version's cached model.

A failed lookup (timeout, refused connection) is answered by the policy; whether the lookups
after it still try Redis is the :class:`Breaker`'s call. It keeps the outcomes of the last
``window`` round trips (of at most ``window_seconds`` ago) and opens when at least
``min_calls`` of them are in the window and a share ``failure_rate`` or more failed, or at once
when the connection is refused (a server that is down or restarting: every try would fail as
fast, and hammering it with reconnects helps nobody). While open, lookups are answered by the
policy without touching Redis; ``retry_interval`` seconds after it opened, one lookup goes
through as a probe (half-open): its success closes the breaker, its failure opens it for
another interval. So one slow reply among successes (a stall of a few ms, a GC pause that
makes one read miss the timeout) fails that one lookup only, where the single-failure interval
before it refused every lookup for half a second (36,942 of them, issue 50); a server that
stops answering is noticed within a few failed lookups and costs each lookup after that
nothing until it is back.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from dataclasses import replace

from pipeline.serving.answers import Recommendation
from pipeline.serving.layout import key_of
from pipeline.settings import ON_ERROR


class RedisUnavailable(ConnectionError):
    """Redis did not answer (down, refused, or slower than the timeout)."""


def refused(err: BaseException) -> bool:
    """Whether ``err`` says the server is not there (a refused or dropped connection, a server
    still loading), rather than slow (a timeout): the breaker opens at once on it."""
    import redis

    if isinstance(err, (redis.TimeoutError, TimeoutError)):
        return False
    return isinstance(err, (redis.ConnectionError, ConnectionError)) and not isinstance(
        err, RedisUnavailable)


class Breaker:
    """A circuit breaker over a sliding window of round-trip outcomes (resilience4j's
    count-based window, with a time limit on what counts as recent).

    Closed: every lookup tries Redis; :meth:`success` and :meth:`failure` record outcomes.
    It opens when the last ``window`` outcomes of at most ``window_seconds`` ago number at
    least ``min_calls`` and a share of at least ``failure_rate`` of them failed, or at once on
    a refused connection (:func:`refused`). Open: :meth:`allow` says no until
    ``retry_interval`` seconds have passed, then yes to one caller, the probe (half-open; a
    probe that never reports is replaced after another ``retry_interval``). A success while
    half-open closes it with an empty window; a failure opens it again. Thread-safe: state
    changes happen under a lock, and a closed breaker's :meth:`allow` reads one attribute.

    ``clock`` (seconds, monotonic) is there for tests.

    >>> now = [0.0]
    >>> b = Breaker(0.5, window=4, min_calls=2, clock=lambda: now[0])
    >>> b.success(); b.failure(TimeoutError("slow")); b.state   # 1 of 2 failed: 50 %
    'open'
    >>> b.allow(), b.active
    (False, True)
    >>> now[0] = 0.6
    >>> b.allow(), b.allow(), b.state   # the probe, and a caller refused meanwhile
    (True, False, 'half_open')
    >>> b.success(); b.state, b.allow()
    ('closed', True)
    """

    def __init__(self, retry_interval: float, *, window: int = 20, window_seconds: float = 10.0,
                 failure_rate: float = 0.5, min_calls: int = 5, clock=time.monotonic):
        if not retry_interval >= 0:
            raise ValueError(f"retry_interval is {retry_interval}, expected >= 0 seconds")
        if int(window) < 1:
            raise ValueError(f"breaker window is {window}, expected at least 1 call")
        if not 0 < failure_rate <= 1:
            raise ValueError(f"breaker failure_rate is {failure_rate}, expected a share in "
                             "(0, 1]")
        if not 1 <= int(min_calls) <= int(window):
            raise ValueError(f"breaker min_calls is {min_calls}, expected 1 to the window "
                             f"({window})")
        if not window_seconds > 0:
            raise ValueError(f"breaker window_seconds is {window_seconds}, expected > 0")
        self.retry_interval = float(retry_interval)
        self.window, self.window_seconds = int(window), float(window_seconds)
        self.failure_rate, self.min_calls = float(failure_rate), int(min_calls)
        self.clock = clock
        self.state = "closed"
        self.error: BaseException | None = None   # the failure that opened it (or the last)
        self.reason = ""                          # why it opened, for messages
        self.opened_at = self.probe_at = 0.0
        self._outcomes: deque = deque(maxlen=self.window)   # (time, failed)
        self._lock = threading.Lock()

    @property
    def active(self) -> bool:
        """Not closed: lookups may be refused (fast paths step aside for :meth:`allow`)."""
        return self.state != "closed"

    def allow(self) -> bool:
        """Whether a lookup may touch Redis now (while open: only the probe)."""
        if self.state == "closed":
            return True
        with self._lock:
            now = self.clock()
            if self.state == "closed":
                return True
            if self.state == "open" and now >= self.opened_at + self.retry_interval:
                self.state, self.probe_at = "half_open", now
                return True
            if self.state == "half_open" and now >= self.probe_at + self.retry_interval:
                self.probe_at = now                # the last probe never reported: another
                return True
            return False

    def success(self) -> None:
        """A round trip got its reply."""
        with self._lock:
            if self.state == "closed":
                self._outcomes.append((self.clock(), False))
            elif self.state == "half_open":        # the probe (or a late reply) got through
                self.state, self.error, self.reason = "closed", None, ""
                self._outcomes.clear()
            # open: a reply to a call sent before it opened says nothing about now

    def failure(self, err: BaseException) -> None:
        """A round trip failed with ``err`` (timeout, refused, cluster down)."""
        with self._lock:
            now = self.clock()
            if self.state != "closed":
                if self.state == "half_open":      # the probe failed: another interval
                    self.state, self.opened_at, self.error = "open", now, err
                    self.reason = "the probe after the retry interval failed"
                return
            self._outcomes.append((now, True))
            if refused(err):
                self._open(now, err, "the connection was refused")
                return
            recent = [failed for t, failed in self._outcomes if now - t <= self.window_seconds]
            failed = sum(recent)
            if len(recent) >= self.min_calls and failed >= self.failure_rate * len(recent):
                self._open(now, err, f"{failed} of the last {len(recent)} round trips failed")

    def _open(self, now: float, err: BaseException, reason: str) -> None:
        self.state, self.opened_at, self.error, self.reason = "open", now, err, reason
        self._outcomes.clear()


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
    again)`` instead when Redis is down or the breaker refuses (``again``: a new failure, which
    the breaker records; False when the breaker refused without trying). The ``failed``
    callables here answer by the policy: :meth:`answers`, :meth:`scorer_state`,
    :meth:`no_answer`. ``outage`` is the breaker under its older name (the list reads' fast
    paths step aside while it is ``active``)."""

    def __init__(self, policy: RaisePolicy, breaker: Breaker, resolver, where: str):
        self.policy, self.breaker, self.resolver, self.where = policy, breaker, resolver, where
        self.outage = breaker

    def run(self, model: str, attempt, failed):
        from pipeline.serving.transport import Down

        if not self.breaker.allow():   # (error is None only if it closed in between)
            return failed(self.breaker.error or RedisUnavailable("circuit breaker open"), False)
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
        """Record a new failure with the breaker (``again``) and say what happened and what to
        do. No promise of a retry: a one-shot command (``rankstream recommend``) exits after
        it, and a long-lived client touches Redis again when the breaker lets it."""
        if again:
            self.breaker.failure(err)
            note = ""
        else:
            note = (f"; not tried: the client's circuit breaker is open ({self.breaker.reason}),"
                    f" it tries again {self.breaker.retry_interval:g} s after opening")
        return (f"Redis at {self.where} is unavailable ({type(err).__name__}: {err}){note}; "
                "check that it is running and reachable at that address, then try again")

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
