"""Redis stopped or paused mid-run: the configured policy happens (a clear exception, or the
last-known answer), lookups fail fast while it is down, and recover once it is back. (The
circuit breaker itself, under stalls short and long: ``test_breaker.py``.)"""

from __future__ import annotations

import time

import pytest

from pipeline.serving.layout import UnknownModelError
from pipeline.serving.lookup import RedisUnavailable, TopK
from pipeline.serving.publish import publish
from tests.serving.helpers import reference_fallback, reference_user, same_answer, user_model


def _wait_until(fn, timeout=10.0, waiting_for=(RedisUnavailable, UnknownModelError)):
    deadline = time.monotonic() + timeout
    while True:
        try:
            return fn()
        except waiting_for:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)


def test_raise_policy_and_recovery_after_restart(own_redis):
    art = user_model(0, n_users=10)
    publish("m", art, own_redis.url, top_k=5)
    topk = TopK(own_redis.url, on_error="raise", timeout=0.3, retry_interval=0.3)
    assert same_answer(topk.recommend("m", 1, k=5).items, reference_user(art, 0, 5))
    own_redis.stop()
    t0 = time.monotonic()
    with pytest.raises(RedisUnavailable, match=r"Redis at redis://127\.0\.0\.1:\d+/0 is "
                                               "unavailable"):
        topk.recommend("m", 1, k=5)
    # refused: the breaker opened at once, so within retry_interval this fails without trying
    with pytest.raises(RedisUnavailable, match="not tried: the client's circuit breaker"):
        topk.recommend_many("m", [1, 11], k=5)
    assert time.monotonic() - t0 < 10.0  # fails fast rather than hanging (generous: shared CPU)
    own_redis.start()  # same port, empty (no persistence)
    with pytest.raises(UnknownModelError):  # back, but empty
        _wait_until(lambda: topk.recommend("m", 1, k=5), waiting_for=RedisUnavailable)
    art2 = user_model(1, n_users=10)
    publish("m", art2, own_redis.url, top_k=5)
    rec = topk.recommend("m", 1, k=5)
    assert rec.version == 1 and not rec.stale
    assert same_answer(rec.items, reference_user(art2, 0, 5))
    topk.close()


def test_last_known_policy_answers_from_memory_and_recovers(own_redis):
    art = user_model(2, n_users=10)
    publish("m", art, own_redis.url, top_k=5)
    topk = TopK(own_redis.url, on_error="last_known", timeout=0.3, retry_interval=0.2)
    fresh = topk.recommend("m", 1, k=5)
    batch = topk.recommend_many("m", [11, 21], k=3)
    own_redis.stop()
    stale = topk.recommend("m", 1, k=3)
    assert stale.stale and stale.items == fresh.items[:3] and stale.source == "precomputed"
    never_asked = topk.recommend("m", 31, k=4)  # not cached: the last-known fallback list
    assert never_asked.stale and never_asked.source == "fallback"
    assert same_answer(never_asked.items, reference_fallback(art, 4))
    again = topk.recommend_many("m", [11, 21], k=3)
    assert [r.items for r in again] == [r.items for r in batch] and all(r.stale for r in again)
    with pytest.raises(RedisUnavailable, match="no last-known answer for model 'other'"):
        topk.recommend("other", 1)
    own_redis.start()
    publish("m", art, own_redis.url, top_k=5)
    rec = _wait_until(lambda: _fresh(topk))
    assert same_answer(rec.items, reference_user(art, 0, 5))


def _fresh(topk):
    rec = topk.recommend("m", 1, k=5)
    if rec.stale:
        raise RedisUnavailable("still stale")
    return rec


def test_slow_redis_times_out_then_recovers(own_redis):
    art = user_model(3, n_users=10)
    publish("m", art, own_redis.url, top_k=5)
    strict = TopK(own_redis.url, on_error="raise", timeout=0.2, retry_interval=5.0)
    lenient = TopK(own_redis.url, on_error="last_known", timeout=0.2, retry_interval=5.0)
    expected = strict.recommend("m", 1, k=5).items
    assert lenient.recommend("m", 1, k=5).items == expected
    own_redis.pause()
    try:
        t0 = time.monotonic()
        with pytest.raises(RedisUnavailable, match="TimeoutError"):
            strict.recommend("m", 1, k=5)
        assert 0.15 < time.monotonic() - t0 < 10.0  # the timeout, not a hang
        rec = lenient.recommend("m", 1, k=5)
        assert rec.stale and rec.items == expected
    finally:
        own_redis.resume()
    # one timeout among successes opens no breaker: the next lookups answer at once, not
    # after retry_interval (issue 50)
    assert strict.breaker.state == "closed" and lenient.breaker.state == "closed"
    assert strict.recommend("m", 1, k=5).items == expected
    assert not lenient.recommend("m", 1, k=5).stale


def test_policy_namespace_and_timeout_come_from_settings(own_redis):
    from pipeline.settings import Settings

    settings = Settings.load(environ={"RANKSTREAM_REDIS_URL": own_redis.url,
                                      "RANKSTREAM_NAMESPACE": "prod",
                                      "RANKSTREAM_REDIS_TIMEOUT": "0.25",
                                      "RANKSTREAM_REDIS_ON_ERROR": "last_known"})
    art = user_model(5, n_users=4)
    publish("m", art, own_redis.url, top_k=5, namespace="prod")
    topk = TopK.from_settings(settings)
    assert topk.on_error == "last_known" and topk.namespace == "prod"
    assert topk.transport.client.connection_pool.connection_kwargs["socket_timeout"] == 0.25
    fresh = topk.recommend("m", 1, k=5)
    own_redis.stop()
    assert topk.recommend("m", 1, k=5).items == fresh.items
    with pytest.raises(ValueError, match="expected 'raise' or 'last_known'"):
        TopK.from_settings(settings, on_error="ignore")
    with pytest.raises(ValueError, match="no Redis URL configured"):
        TopK.from_settings(Settings())
