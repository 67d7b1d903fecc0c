"""The refreshers' Prometheus metrics, read at scrape time from the stats each refresher keeps
(:mod:`pipeline.refresh.stats`; ``rankstream metrics``, and ``rankstream serve
--pipeline-metrics``):

==============================================  =============================================
``rankstream_refresh_lag_seconds{model}``       histogram: a live event's timestamp → its
                                                user's keys written
``rankstream_refresh_users_total{model}``       users refreshed
``rankstream_refresh_events_total{model}``      events applied
``rankstream_refresh_heals_total{model}``       republished after Redis lost the model
``rankstream_refresh_flips_total{model}``       served versions re-applied to
``rankstream_refresh_rejoins_total{model}``     stalled rebalances and stretches without a
                                                partition, joined again
``rankstream_refresh_backlog{model,partition}``  messages behind the partition's end
``rankstream_refresh_stats_age_seconds{model}``  since the refresher last wrote its stats (a
                                                stopped refresher's numbers grow old)
==============================================  =============================================
"""

from __future__ import annotations

import time

from pipeline.refresh.stats import read_stats


class RefreshCollector:
    """The metrics above for the refreshers of ``models`` under ``settings.home``."""

    def __init__(self, settings, models: list[str]):
        self.settings, self.models = settings, list(models)

    def collect(self):
        from prometheus_client.core import (
            CounterMetricFamily,
            GaugeMetricFamily,
            HistogramMetricFamily,
        )

        lag = HistogramMetricFamily("rankstream_refresh_lag_seconds",
                                    "event timestamp to its user's keys written",
                                    labels=["model"])
        counters = {name: CounterMetricFamily(f"rankstream_refresh_{name}", help_, labels=["model"])
                    for name, help_ in (("users", "users refreshed"),
                                        ("events", "events applied"),
                                        ("heals", "republished after Redis lost the model"),
                                        ("flips", "served versions re-applied to"),
                                        ("rejoins", "rebalances given up on, joined again"))}
        backlog = GaugeMetricFamily("rankstream_refresh_backlog", "messages behind the end",
                                    labels=["model", "partition"])
        age = GaugeMetricFamily("rankstream_refresh_stats_age_seconds",
                                "since the refresher last wrote its stats", labels=["model"])
        for model in self.models:
            s = read_stats(self.settings.home, model)
            if not s:
                continue
            cumulative, buckets = 0, []
            for bound, count in zip([*s["lag_buckets"], "+Inf"], s["lag_counts"]):
                cumulative += count
                buckets.append((str(bound), cumulative))
            lag.add_metric([model], buckets, s["lag_sum"])
            for name, key in (("users", "users_refreshed"), ("events", "events"),
                              ("heals", "heals"), ("flips", "flips"), ("rejoins", "rejoins")):
                counters[name].add_metric([model], s.get(key, 0))
            for partition, behind in s.get("backlog", {}).items():
                backlog.add_metric([model, partition], behind)
            age.add_metric([model], max(0.0, time.time() - s.get("updated_at", 0.0)))
        yield from (lag, *counters.values(), backlog, age)
