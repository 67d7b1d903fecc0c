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
"""

from __future__ import annotations

import os
from collections import Counter as _Tally

# seconds: 50 µs .. 1 s, dense where the API's answers are (0.1 .. 2 ms)
BUCKETS = (50e-6, 100e-6, 200e-6, 300e-6, 400e-6, 500e-6, 750e-6, 1e-3, 1.5e-3, 2e-3, 3e-3,
           5e-3, 10e-3, 25e-3, 50e-3, 100e-3, 250e-3, 1.0)


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

    def observe(self, route: str, model: str | None, seconds: float, status: int,
                answers=()) -> None:
        """One request: its latency, status and the sources of its answers."""
        # label children are cached: labels() costs about as much as the update itself
        key = (route, model, status)
        children = self._children.get(key)
        if children is None:
            children = self._children[key] = (self.latency.labels(route, model or ""),
                                              self.requests.labels(route, str(status)))
        children[0].observe(seconds)
        children[1].inc()
        if len(answers) == 1:
            rec = answers[0]
            self._answer((rec.model, "stale" if rec.stale else rec.source), 1)
        elif answers:
            tally = _Tally((rec.model, "stale" if rec.stale else rec.source) for rec in answers)
            for key, n in tally.items():
                self._answer(key, n)

    def _answer(self, key: tuple, n: int) -> None:
        child = self._children.get(key)
        if child is None:
            child = self._children[key] = self.answers.labels(*key)
        child.inc(n)

    def redis_error(self, model: str | None) -> None:
        self.redis_errors.labels(model or "").inc()

    def exposition(self) -> bytes:
        """The text format of every metric (all server processes' counts summed)."""
        from prometheus_client import CollectorRegistry, generate_latest

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
