"""The lookup client's circuit breaker (issue 50): it opens on a failure rate over a sliding
window or on a refused connection, never on one slow reply among successes; half-open after
``retry_interval``, one probe decides. Pure logic on a fake clock, then a real redis-server
stopped (SIGSTOP) once briefly and once for long while lookups run."""

from __future__ import annotations

import threading
import time

import pytest
import redis

from pipeline.serving.fallback import Breaker, Guard, RaisePolicy, RedisUnavailable, refused
from pipeline.serving.lookup import TopK
from pipeline.serving.publish import publish
from pipeline.serving.transport import Down
from tests.serving.helpers import reference_user, same_answer, user_model

SLOW = redis.TimeoutError("Timeout reading from socket")
REFUSED = redis.ConnectionError("Error 111 connecting to 127.0.0.1:1. Connection refused.")


class Clock:
    def __init__(self):
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def _breaker(**kw) -> tuple[Breaker, Clock]:
    clock = Clock()
    return Breaker(kw.pop("retry_interval", 0.5), clock=clock, **kw), clock


def test_one_timeout_among_successes_does_not_open():
    b, clock = _breaker()
    for _ in range(10):
        assert b.allow()
        b.success()
        clock.now += 0.01
    b.failure(SLOW)
    assert b.state == "closed" and not b.active and b.allow()
    for _ in range(30):     # a timeout now and then, among successes: never opens
        for _ in range(5):
            b.success()
        b.failure(SLOW)
        assert b.allow()
    assert b.state == "closed"


def test_opens_at_the_failure_rate_over_the_last_window_calls():
    b, _ = _breaker(window=20, failure_rate=0.5, min_calls=5)
    for _ in range(20):
        b.success()
    for n in range(9):      # 9 of the last 20 failed: 45 %
        b.failure(SLOW)
        assert b.state == "closed", n
    b.failure(SLOW)         # 10 of 20
    assert b.state == "open" and not b.allow()
    assert "10 of the last 20 round trips failed" in b.reason and b.error is SLOW


def test_needs_min_calls_and_forgets_outcomes_older_than_window_seconds():
    b, clock = _breaker(window=20, window_seconds=10.0, min_calls=5)
    for _ in range(4):      # 4 of 4 failed: too few calls to judge
        b.failure(SLOW)
        assert b.state == "closed"
    clock.now += 11         # those are history now
    b.failure(SLOW)
    assert b.state == "closed"
    for _ in range(4):
        b.failure(SLOW)
    assert b.state == "open"


def test_a_refused_connection_opens_at_once_a_timeout_does_not():
    assert refused(REFUSED) and refused(ConnectionRefusedError(111, "refused"))
    assert refused(redis.BusyLoadingError("loading"))
    assert not refused(SLOW) and not refused(TimeoutError()) and not refused(ValueError())
    assert not refused(RedisUnavailable("x"))
    b, _ = _breaker()
    for _ in range(20):
        b.success()
    b.failure(REFUSED)
    assert b.state == "open" and b.reason == "the connection was refused"


def test_half_open_lets_one_probe_through_whose_outcome_decides():
    b, clock = _breaker(retry_interval=0.5)
    b.failure(REFUSED)
    clock.now += 0.49
    assert not b.allow()
    clock.now += 0.02
    assert b.allow() and b.state == "half_open"     # the probe
    assert not b.allow() and not b.allow()          # everyone else: refused meanwhile
    b.failure(SLOW)                                 # the probe failed: another interval
    assert b.state == "open" and not b.allow()
    clock.now += 0.3
    assert not b.allow()
    clock.now += 0.25
    assert b.allow()                                # the next probe
    b.success()
    assert b.state == "closed" and b.allow() and b.allow() and b.error is None
    b.failure(SLOW)                                 # a fresh window after closing
    assert b.state == "closed"


def test_a_probe_that_never_reports_is_replaced_and_late_replies_are_ignored():
    b, clock = _breaker(retry_interval=0.5)
    b.failure(REFUSED)
    b.success()                 # a reply to a call sent before it opened: still open
    assert b.state == "open"
    clock.now += 0.5
    assert b.allow() and not b.allow()
    clock.now += 0.5            # the probe raised something else and never reported
    assert b.allow()
    b.success()
    assert b.state == "closed"


@pytest.mark.parametrize("kw, message", [
    ({"retry_interval": -1}, "retry_interval is -1"),
    ({"window": 0}, "window is 0"),
    ({"failure_rate": 0}, "failure_rate is 0"),
    ({"failure_rate": 1.5}, "failure_rate is 1.5"),
    ({"min_calls": 30}, r"min_calls is 30, expected 1 to the window \(20\)"),
    ({"window_seconds": 0}, "window_seconds is 0"),
])
def test_parameters_are_checked(kw, message):
    with pytest.raises(ValueError, match=message):
        Breaker(kw.pop("retry_interval", 0.5), **kw)


def test_threads_hammering_it_leave_it_consistent():
    b = Breaker(0.001, window=20, min_calls=5)
    errors = []

    def work(seed: int):
        try:
            for i in range(20_000):
                if b.allow():
                    if (i * 7 + seed) % 3:
                        b.success()
                    else:
                        b.failure(SLOW)
        except Exception as err:   # pragma: no cover - the failure being tested for
            errors.append(err)

    threads = [threading.Thread(target=work, args=(s,)) for s in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    assert b.state in ("closed", "open", "half_open") and len(b._outcomes) <= 20


class _Resolver:
    """A resolver that runs the attempt once, as VersionResolver.retrying does without
    vanishing versions."""

    current: dict = {}

    @staticmethod
    def retrying(model, attempt):
        return attempt()


def test_guard_fails_the_timed_out_lookup_alone():
    b, clock = _breaker()
    guard = Guard(RaisePolicy(), b, _Resolver(), "redis://127.0.0.1:1/0")
    tried = []

    def ok():
        tried.append(1)
        b.success()              # what Transport does on a reply
        return "answer"

    def slow():
        tried.append(1)
        raise Down(SLOW)

    for _ in range(10):
        assert guard.run("m", ok, guard.no_answer) == "answer"
    with pytest.raises(RedisUnavailable, match="TimeoutError"):
        guard.run("m", slow, guard.no_answer)
    n = len(tried)
    assert guard.run("m", ok, guard.no_answer) == "answer" and len(tried) == n + 1
    with pytest.raises(RedisUnavailable, match="ConnectionError"):
        guard.run("m", lambda: (_ for _ in ()).throw(REFUSED), guard.no_answer)
    n = len(tried)           # open: refused without trying, and the message says why
    with pytest.raises(RedisUnavailable, match="not tried: the client's circuit breaker is "
                                               r"open \(the connection was refused\)"):
        guard.run("m", ok, guard.no_answer)
    assert len(tried) == n
    clock.now += 0.5
    assert guard.run("m", ok, guard.no_answer) == "answer" and b.state == "closed"


# ----------------------------------------------------------------------- a real stalled server

def _lookup_loop(topk, users, stop, log):
    i = 0
    while not stop.is_set():
        t0 = time.monotonic()
        try:
            topk.recommend("m", users[i % len(users)], k=5)
            ok, message = True, ""
        except RedisUnavailable as err:
            ok, message = False, str(err)
        log.append((t0, time.monotonic(), ok, message))
        i += 1
        time.sleep(0.002)


def test_a_stalled_server_short_then_long(own_redis):
    art = user_model(4, n_users=50)
    publish("m", art, own_redis.url, top_k=5)
    users = art.key_ids.tolist()
    timeout, retry = 0.1, 0.5
    topk = TopK(own_redis.url, on_error="raise", timeout=timeout, retry_interval=retry)
    try:
        for row, u in enumerate(users):
            assert same_answer(topk.recommend("m", u, k=5).items, reference_user(art, row, 5))

        # a stall of 0.3 s with one lookup in it: that lookup times out, the next ones answer
        own_redis.pause()
        try:
            t0 = time.monotonic()
            with pytest.raises(RedisUnavailable, match="TimeoutError"):
                topk.recommend("m", users[0], k=5)
            assert timeout * 0.8 < time.monotonic() - t0 < 5.0
            time.sleep(max(0.0, 0.3 - (time.monotonic() - t0)))
        finally:
            own_redis.resume()
        resumed = time.monotonic()
        for row, u in enumerate(users[:20]):   # no retry interval: answered right away
            assert same_answer(topk.recommend("m", u, k=5).items, reference_user(art, row, 5))
        assert time.monotonic() - resumed < retry
        assert topk.breaker.state == "closed"

        # a stall of 1.5 s under 4 threads of lookups: the breaker opens, lookups fail fast,
        # and after SIGCONT they answer again within about retry_interval
        stop = threading.Event()
        logs: list[list] = [[] for _ in range(4)]
        threads = [threading.Thread(target=_lookup_loop, args=(topk, users, stop, log))
                   for log in logs]
        for t in threads:
            t.start()
        try:
            time.sleep(0.3)
            own_redis.pause()
            paused = time.monotonic()
            try:
                time.sleep(1.5)
            finally:
                own_redis.resume()
            resumed = time.monotonic()
            time.sleep(1.5)
        finally:
            stop.set()
            for t in threads:
                t.join(30)
    finally:
        own_redis.resume()
        topk.close()
    entries = sorted(e for log in logs for e in log)
    before = [e for e in entries if e[1] < paused]
    assert before and all(e[2] for e in before)
    stalled = [e for e in entries if e[0] >= paused + 0.05 and e[1] < resumed]
    slow = [e for e in stalled if not e[2] and e[1] - e[0] >= timeout * 0.8]
    fast = [e for e in stalled if not e[2] and e[1] - e[0] < timeout * 0.5]
    assert all(not e[2] for e in stalled)
    # without the breaker every one of these would have waited the timeout
    assert len(fast) >= 20 and len(fast) > 3 * len(slow), (len(fast), len(slow))
    assert any("circuit breaker is open" in e[3] for e in fast)
    first_ok = min(e[1] for e in entries if e[2] and e[0] >= resumed - 0.2)
    assert first_ok - resumed < retry + timeout + 0.5, first_ok - resumed
    settled = [e for e in entries if e[0] >= first_ok + 0.05]
    assert settled and all(e[2] for e in settled)
