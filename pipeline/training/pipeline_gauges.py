"""The pipeline's Prometheus metrics, read at scrape time (``rankstream metrics``, or with
``rankstream serve --pipeline-metrics`` in the API's own ``/metrics``, so one scrape sees both):

=======================================================  ====================================
``rankstream_ingest_lag{topic, partition}``              Kafka's log end offset minus the
                                                         store's end: events not stored yet
``rankstream_store_end_offset{topic, partition}``        one past the last offset stored
``rankstream_kafka_up``                                  1 when Kafka answered this scrape
                                                         (with Kafka configured)
``rankstream_dead_letters{reason}``                      dead letters kept, by reason class
                                                         (the reason up to its first ``:``)
``rankstream_last_retrain_seconds{model}``               how long the last run took
``rankstream_last_retrain_timestamp_seconds{model}``     when it finished
``rankstream_last_retrain{model, decision}``             1 for the last run's decision
=======================================================  ====================================

Dead-letter segments are immutable once written, so each is counted once per process; a scrape
reads only the new ones. Kafka is asked with short timeouts; when it does not answer, the lag
is left out (``rankstream_kafka_up 0``) and it is asked again after ``KAFKA_RETRY`` seconds.
"""

from __future__ import annotations

import time
from collections import Counter
from datetime import datetime

from pipeline.training.retrain import outcome_path
from pipeline.training.run_types import Decision

KAFKA_RETRY = 30.0
KAFKA_TIMEOUT_MS = 2000


def reason_class(reason: str) -> str:
    """The bounded part of a dead letter's reason: its text up to the first ``:`` (values
    follow it), at most 80 characters.

    >>> reason_class("bad JSON: Expecting value at line 1 column 1")
    'bad JSON'
    """
    return (reason or "unknown").split(":", 1)[0].strip()[:80] or "unknown"


class PipelineCollector:
    """The metrics above for ``settings`` (home, store, Kafka) and the configured ``models``."""

    def __init__(self, settings, models: list[str]):
        self.settings, self.models = settings, list(models)
        self._counted: dict = {}       # dead-letter segment path -> reasons counted in it
        self._store = None
        self._consumer = None
        self._kafka_down_since: float | None = None

    def collect(self):
        from prometheus_client.core import GaugeMetricFamily

        from pipeline.ingest.open_store import open_store

        if self._store is None:      # kept: an object store's commits are read once
            self._store = open_store(self.settings)
        store = self._store
        yield from self._lag(store, GaugeMetricFamily)
        dead = GaugeMetricFamily("rankstream_dead_letters", "dead letters kept, by reason",
                                 labels=["reason"])
        for reason, n in sorted(self._dead_letters(store).items()):
            dead.add_metric([reason], n)
        yield dead
        yield from self._retrains(GaugeMetricFamily)

    # ------------------------------------------------------------------ ingest
    def _lag(self, store, Gauge):
        end = Gauge("rankstream_store_end_offset", "one past the last offset stored",
                    labels=["topic", "partition"])
        lag = Gauge("rankstream_ingest_lag", "Kafka log end offset minus the store's end",
                    labels=["topic", "partition"])
        up = Gauge("rankstream_kafka_up", "1 when Kafka answered this scrape")
        stored: dict[tuple[str, int], int] = {}
        for (name, partition), offset in store.next_offsets().items():
            if name.startswith("~"):      # file logs, not Kafka topics
                continue
            topic = name.split("~g", 1)[0]
            if store.generation(topic, partition) == name:   # the newest generation's end
                stored[(topic, partition)] = offset
                end.add_metric([topic, str(partition)], offset)
        ends = self._kafka_ends(sorted({t for t, _ in stored}))
        if ends is not None:
            for (topic, partition), log_end in sorted(ends.items()):
                lag.add_metric([topic, str(partition)],
                               max(0, log_end - stored.get((topic, partition), 0)))
        up.add_metric([], int(ends is not None))
        yield from (end, lag, up) if self.settings.kafka_bootstrap else (end,)

    def _kafka_ends(self, topics: list[str]) -> dict | None:
        """``{(topic, partition): log end offset}``; None when Kafka is not configured or did
        not answer (asked again after ``KAFKA_RETRY`` seconds)."""
        if not self.settings.kafka_bootstrap:
            return None
        if self._kafka_down_since and time.monotonic() - self._kafka_down_since < KAFKA_RETRY:
            return None
        try:
            from kafka import KafkaConsumer, TopicPartition

            if self._consumer is None:
                self._consumer = KafkaConsumer(
                    bootstrap_servers=self.settings.kafka_bootstrap,
                    client_id="rankstream-metrics", enable_auto_commit=False,
                    request_timeout_ms=KAFKA_TIMEOUT_MS, bootstrap_timeout_ms=KAFKA_TIMEOUT_MS,
                    **self.settings.kafka_security)
            parts = [TopicPartition(t, p) for t in topics
                     for p in sorted(self._consumer.partitions_for_topic(t) or ())]
            ends = self._consumer.end_offsets(parts) if parts else {}
            if not parts:
                self._consumer.topics()          # nothing stored yet: is Kafka there at all
            self._kafka_down_since = None
            return {(tp.topic, tp.partition): int(o) for tp, o in ends.items()}
        except Exception:   # noqa: BLE001 - Kafka down or slow: no lag this scrape, say so
            self._kafka_down_since = time.monotonic()
            if self._consumer is not None:
                self._consumer.close()
                self._consumer = None
            return None

    def _dead_letters(self, store) -> Counter:
        import pyarrow.parquet as pq

        from pipeline.ingest.dead_letters import DEAD_LETTER_KIND

        files = [seg.path for seg in store.segments(DEAD_LETTER_KIND)]   # whole flushes only
        for path in files:
            if path not in self._counted:
                try:
                    reasons = pq.read_table(str(path), columns=["reason"],
                                            filesystem=store.filesystem).column("reason")
                except (OSError, ValueError, KeyError):    # being written: next scrape
                    continue
                self._counted[path] = Counter(map(reason_class, reasons.to_pylist()))
        present = set(files)
        self._counted = {p: c for p, c in self._counted.items() if p in present}
        return sum(self._counted.values(), Counter())

    # ------------------------------------------------------------------ retrains
    def _retrains(self, Gauge):
        from pipeline.durable import read_json

        seconds = Gauge("rankstream_last_retrain_seconds", "how long the last run took",
                        labels=["model"])
        when = Gauge("rankstream_last_retrain_timestamp_seconds", "when the last run ended",
                     labels=["model"])
        decision = Gauge("rankstream_last_retrain", "1 for the decision of the last run",
                         labels=["model", "decision"])
        kept = outcome_path(self.settings, "_").parent
        models = self.models or (sorted(p.stem for p in kept.glob("*.json"))
                                 if kept.is_dir() else [])
        for model in models:
            try:
                last = read_json(outcome_path(self.settings, model))
            except (OSError, ValueError):
                last = None
            if not last:
                continue
            seconds.add_metric([model], float(last.get("seconds", 0.0)))
            try:
                when.add_metric([model], datetime.fromisoformat(last["finished_at"])
                                .timestamp())
            except (KeyError, TypeError, ValueError):
                pass
            for d in Decision:
                decision.add_metric([model, d.value], int(last.get("decision") == d.value))
        yield from (seconds, when, decision)
