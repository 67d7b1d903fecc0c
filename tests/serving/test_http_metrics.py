"""The API's metrics written in batches (:mod:`pipeline.serving.http_metrics`): the same
exposition as one update per request, at most ``FLUSH_SECONDS`` late on an event loop, and
at once at a scrape."""

from __future__ import annotations

import asyncio
import math
from types import SimpleNamespace

import numpy as np
from prometheus_client import Counter, Histogram
from prometheus_client.parser import text_string_to_metric_families

from pipeline.serving import http_metrics
from pipeline.serving.http_metrics import BUCKETS, FLUSH_SECONDS, ServeMetrics


class _NoModels:
    def model_info(self, model):
        raise AssertionError("no models configured")


def _samples(text: str) -> dict:
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text) for s in family.samples
            if s.name.startswith(("rankstream_request", "rankstream_answers"))
            and not s.name.endswith("_created")}


def _answer(model: str, source: str, stale: bool = False):
    return SimpleNamespace(model=model, source=source, stale=stale)


def _requests(rng, n: int) -> list[tuple]:
    """Random requests: latencies on, around and between every bucket bound and past the
    last, over two routes, two statuses and a few answer sources."""
    bounds = np.array(BUCKETS)
    on_bounds = rng.choice(bounds, n)
    latencies = np.where(rng.random(n) < 0.3, on_bounds,
                         np.exp(rng.uniform(math.log(1e-5), math.log(3.0), n)))
    out = []
    for seconds in latencies.tolist():
        route = str(rng.choice(["recommend", "similar"]))
        status = int(rng.choice([200, 200, 404]))
        answers = [_answer("movies", str(rng.choice(["precomputed", "fallback"])),
                           bool(rng.random() < 0.1)) for _ in range(int(rng.integers(0, 3)))]
        out.append((route, "movies" if status == 200 else None, seconds, status, answers))
    return out


def _one_update_per_request(requests) -> dict:
    """The reference: prometheus-client's own observe/inc, once per request."""
    latency = Histogram("rankstream_request_seconds", "", ["route", "model"], buckets=BUCKETS,
                        registry=None)
    counts = Counter("rankstream_requests", "", ["route", "status"], registry=None)
    answers = Counter("rankstream_answers", "", ["model", "source"], registry=None)
    for route, model, seconds, status, recs in requests:
        latency.labels(route, model or "").observe(seconds)
        counts.labels(route, str(status)).inc()
        for rec in recs:
            answers.labels(rec.model, "stale" if rec.stale else rec.source).inc()
    out = {}
    for metric in (latency, counts, answers):
        for family in metric.collect():
            for s in family.samples:
                if not s.name.endswith("_created"):
                    out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def _assert_same(got: dict, want: dict) -> None:
    assert set(got) == set(want)
    for key, value in want.items():
        assert math.isclose(got[key], value, rel_tol=1e-12, abs_tol=1e-12), (key, got[key],
                                                                              value)


def test_batched_writes_match_one_update_per_request(monkeypatch):
    monkeypatch.delenv("PROMETHEUS_MULTIPROC_DIR", raising=False)
    requests = _requests(np.random.default_rng(7), 3000)
    metrics = ServeMetrics(_NoModels(), [])

    async def serve():          # on a loop, as the server counts: written by the flush
        for request in requests:
            metrics.observe(*request)
    asyncio.run(serve())
    _assert_same(_samples(metrics.exposition().decode()), _one_update_per_request(requests))


def test_a_histogram_without_the_batch_path_gets_one_observe_per_value():
    seen = []
    plain = SimpleNamespace(observe=seen.append)
    http_metrics._observe_all(plain, [0.1, 0.2, 0.1])
    assert seen == [0.1, 0.2, 0.1]


def test_counts_are_written_within_the_flush_interval_on_a_loop(monkeypatch):
    monkeypatch.delenv("PROMETHEUS_MULTIPROC_DIR", raising=False)
    metrics = ServeMetrics(_NoModels(), [])
    child = metrics.requests.labels("recommend", "200")

    async def serve():
        metrics.observe("recommend", "movies", 1e-4, 200, [_answer("movies", "precomputed")])
        metrics.observe("recommend", "movies", 2e-4, 200)
        kept = child._value.get()           # not yet written: kept for the batch
        await asyncio.sleep(FLUSH_SECONDS * 1.5)
        return kept, child._value.get()
    kept, written = asyncio.run(serve())
    assert (kept, written) == (0, 2)
    assert metrics._flush_at is None        # nothing left scheduled


def test_without_a_loop_counts_are_written_at_once(monkeypatch):
    monkeypatch.delenv("PROMETHEUS_MULTIPROC_DIR", raising=False)
    metrics = ServeMetrics(_NoModels(), [])
    metrics.observe("similar", "movies", 3e-4, 200)
    assert metrics.requests.labels("similar", "200")._value.get() == 1


def test_counts_kept_on_a_loop_that_ended_are_written_from_the_next(monkeypatch):
    monkeypatch.delenv("PROMETHEUS_MULTIPROC_DIR", raising=False)
    metrics = ServeMetrics(_NoModels(), [])
    child = metrics.requests.labels("recommend", "200")

    async def one_request():
        metrics.observe("recommend", "movies", 1e-4, 200)
    asyncio.run(one_request())              # the loop ends before its flush is due

    async def next_loop():
        await one_request()
        await asyncio.sleep(FLUSH_SECONDS * 1.5)
        return child._value.get()
    assert asyncio.run(next_loop()) == 2
