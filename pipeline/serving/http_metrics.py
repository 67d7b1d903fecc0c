"""Prometheus metrics of the HTTP API (prometheus-client, the ecosystem's convention).

Counted as requests come:

==================================================  =========================================
``rankstream_request_seconds{route, model}``        latency histogram, buckets from 50 µs
``rankstream_requests_total{route, status}``        answers by HTTP status
``rankstream_answers_total{model, source}``         lookups by how they were answered:
                                                    precomputed, on_demand, global, fold_in,
                                                    fresh, scored, fallback, missing, trivial,
                                                    challenger-NAME, blend-NAME, stale
``rankstream_redis_errors_total{model}``            requests Redis could not answer (503)
==================================================  =========================================

Read from Redis at each scrape, per configured model: ``rankstream_served_version``,
``rankstream_model_age_seconds`` (since the served version was trained) and
``rankstream_fallback_share`` (of its lookups, all clients together).

``rankstream serve`` runs one process per core; each counts into its own files under
``PROMETHEUS_MULTIPROC_DIR`` (prometheus-client's multiprocess mode) and a scrape of any of
them sums all. Without that variable the counts are this process's own. Model labels are only
those of published models (an unknown name in a URL is counted without one), so a client
cannot grow the label sets.

A request's counts are kept in the process and written at most ``FLUSH_SECONDS`` later, all
requests of that spell together: in multiprocess mode every update is a locked write to a
mapped file, four per request (3 µs timed alone; 10-35 µs of a loaded server's CPU per
request, a tenth of a lookup's, in an A/B), where a spell's requests of one route share
them. A scrape writes its own process's counts first; another
worker's reach it within ``FLUSH_SECONDS``. A worker that dies loses at most that spell.
"""

from __future__ import annotations

import asyncio
import os
from bisect import bisect_left
from collections import Counter as _Tally

# seconds: 50 µs .. 1 s, dense where the API's answers are (0.1 .. 2 ms)
BUCKETS = (50e-6, 100e-6, 200e-6, 300e-6, 400e-6, 500e-6, 750e-6, 1e-3, 1.5e-3, 2e-3, 3e-3,
           5e-3, 10e-3, 25e-3, 50e-3, 100e-3, 250e-3, 1.0)
FLUSH_SECONDS = 0.25     # counts kept in a worker at most this long (see the module)


class ModelCollector:
    """Served version, model age and fallback share of each model, read at scrape time."""

    def __init__(self, topk, models: list[str]):
        self.topk, self.models = topk, list(models)

    def collect(self):
        from prometheus_client.core import GaugeMetricFamily

        version = GaugeMetricFamily("rankstream_served_version",
                                    "version number served per model", labels=["model"])
        age = GaugeMetricFamily("rankstream_model_age_seconds",
                                "seconds since the served version was trained",
                                labels=["model"])
        share = GaugeMetricFamily("rankstream_fallback_share",
                                  "share of lookups of the served version answered from the "
                                  "fallback list", labels=["model"])
        up = GaugeMetricFamily("rankstream_redis_up", "1 when Redis answered this scrape")
        try:
            for model in self.models:
                info = self.topk.model_info(model)
                if info.version is None:
                    continue
                version.add_metric([model], info.version)
                if info.age_seconds is not None:
                    age.add_metric([model], info.age_seconds)
                if info.fallback_share is not None:
                    share.add_metric([model], info.fallback_share)
            up.add_metric([], 1)
        except Exception:   # noqa: BLE001 - Redis down: say so, keep the rest of the scrape
            up.add_metric([], 0)
        yield from (version, age, share, up)


class ServeMetrics:
    """The API's metrics (see the module) and its scrape; ``extra`` collectors (e.g. the
    pipeline's, :mod:`pipeline.training.pipeline_gauges`) join every scrape."""

    def __init__(self, topk, models: list[str], extra=()):
        from prometheus_client import CONTENT_TYPE_LATEST, Counter, Histogram

        self.content_type = CONTENT_TYPE_LATEST
        self.directory = os.environ.get("PROMETHEUS_MULTIPROC_DIR")
        self.latency = Histogram("rankstream_request_seconds", "HTTP request latency",
                                 ["route", "model"], buckets=BUCKETS, registry=None)
        self.requests = Counter("rankstream_requests", "HTTP answers by status",
                                ["route", "status"], registry=None)
        self.answers = Counter("rankstream_answers", "lookups by how they were answered",
                               ["model", "source"], registry=None)
        self.redis_errors = Counter("rankstream_redis_errors",
                                    "requests Redis could not answer", ["model"],
                                    registry=None)
        self.collectors = [ModelCollector(topk, models), *extra]
        self._children: dict = {}
        # counted, not yet written: (route, model, status) -> latencies; (model, source) -> n
        self._latencies: dict = {}
        self._answers: _Tally = _Tally()
        self._flush_loop = self._flush_at = None   # the loop and its handle of the next flush

    def observe(self, route: str, model: str | None, seconds: float, status: int,
                answers=()) -> None:
        """One request: its latency, status and the sources of its answers (written by
        :meth:`flush`, at most ``FLUSH_SECONDS`` later on a running event loop, else now)."""
        key = (route, model, status)
        latencies = self._latencies.get(key)
        if latencies is None:
            latencies = self._latencies[key] = []
        latencies.append(seconds)
        for rec in answers:
            self._answers[rec.model, "stale" if rec.stale else rec.source] += 1
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:                # no event loop (a script, a test): write now
            self.flush()
            return
        if loop is not self._flush_loop:    # the first request, or a new loop (a test's)
            self._flush_loop, self._flush_at = loop, None
        if self._flush_at is None:
            self._flush_at = loop.call_later(FLUSH_SECONDS, self.flush)

    def flush(self) -> None:
        """Write what :meth:`observe` counted: per (route, model, status) one update of the
        request counter, of the latency sum and of each latency bucket touched."""
        if self._flush_at is not None:
            self._flush_at.cancel()
            self._flush_at = None
        latencies, self._latencies = self._latencies, {}
        answers, self._answers = self._answers, _Tally()
        for key, seconds in latencies.items():
            children = self._children.get(key)
            if children is None:      # labels() costs about as much as an update: cached
                route, model, status = key
                children = self._children[key] = (self.latency.labels(route, model or ""),
                                                  self.requests.labels(route, str(status)))
            _observe_all(children[0], seconds)
            children[1].inc(len(seconds))
        for key, n in answers.items():
            child = self._children.get(key)
            if child is None:
                child = self._children[key] = self.answers.labels(*key)
            child.inc(n)

    def redis_error(self, model: str | None) -> None:
        self.redis_errors.labels(model or "").inc()

    def exposition(self) -> bytes:
        """The text format of every metric (all server processes' counts summed)."""
        from prometheus_client import CollectorRegistry, generate_latest

        self.flush()
        registry = CollectorRegistry()
        if self.directory:
            from prometheus_client.multiprocess import MultiProcessCollector

            MultiProcessCollector(registry, path=self.directory)
        else:
            for metric in (self.latency, self.requests, self.answers, self.redis_errors):
                registry.register(metric)
        for collector in self.collectors:
            registry.register(collector)
        return generate_latest(registry)


def _observe_all(histogram, seconds: list[float]) -> None:
    """``histogram.observe`` of every value in ``seconds``, one update per bucket touched and
    one of the sum. An observation goes to the first bucket whose upper bound is at least it
    (``bisect_left`` over the bounds, which end with +Inf), as ``observe`` puts it. Reaches
    the child's values (``_upper_bounds``, ``_buckets``, ``_sum``: prometheus-client has no
    public batch update); a client without them gets one ``observe`` per value."""
    bounds = getattr(histogram, "_upper_bounds", None)
    buckets, total = getattr(histogram, "_buckets", None), getattr(histogram, "_sum", None)
    if bounds is None or buckets is None or total is None:
        for value in seconds:
            histogram.observe(value)
        return
    total.inc(sum(seconds))
    for i, n in _Tally(bisect_left(bounds, value) for value in seconds).items():
        buckets[i].inc(n)
