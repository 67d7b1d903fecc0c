"""What a refresher reports (``rankstream metrics`` and ``/metrics`` export it): the refresh
lag of each live event (its timestamp → its user's keys written), users refreshed, events,
flips re-applied, heals, and the Kafka backlog per partition. Kept as one JSON file per model,
``HOME/refresh/<model>.json``, rewritten atomically every couple of seconds."""

from __future__ import annotations

import bisect
import time
from dataclasses import dataclass, field
from pathlib import Path

from pipeline.durable import read_json, write_json

LAG_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1.0, 2.0, 5.0, 10.0, 30.0, 60.0)   # seconds, then +Inf


def stats_path(home, model: str) -> Path:
    return Path(home) / "refresh" / f"{model}.json"


def read_stats(home, model: str) -> dict | None:
    """The last stats a refresher of ``model`` wrote here, or None."""
    try:
        return read_json(stats_path(home, model))
    except ValueError:
        return None


@dataclass
class RefreshStats:
    model: str
    version: int | None = None
    users_refreshed: int = 0
    events: int = 0
    replayed_users: int = 0        # recomputed after a flip or a heal
    flips: int = 0
    heals: int = 0
    rejoins: int = 0               # stalled rebalances and partitionless stretches, joined again
    last_heal: str = ""
    nothing_to_refresh: str = ""   # why, for a version whose shape has no per-user state
    lag_counts: list = field(default_factory=lambda: [0] * (len(LAG_BUCKETS) + 1))
    lag_sum: float = 0.0
    lag_max: float = 0.0
    backlog: dict = field(default_factory=dict)    # "topic/partition" -> messages behind
    recent_lags: list = field(default_factory=list)

    def lag(self, seconds: float) -> None:
        """Count one live event's refresh lag."""
        seconds = max(0.0, seconds)
        self.lag_counts[bisect.bisect_left(LAG_BUCKETS, seconds)] += 1
        self.lag_sum += seconds
        self.lag_max = max(self.lag_max, seconds)
        self.recent_lags = (self.recent_lags + [seconds])[-1000:]

    def to_json(self) -> dict:
        return {"model": self.model, "version": self.version,
                "users_refreshed": self.users_refreshed, "events": self.events,
                "replayed_users": self.replayed_users, "flips": self.flips,
                "heals": self.heals, "rejoins": self.rejoins, "last_heal": self.last_heal,
                "nothing_to_refresh": self.nothing_to_refresh,
                "lag_buckets": list(LAG_BUCKETS), "lag_counts": self.lag_counts,
                "lag_sum": round(self.lag_sum, 6), "lag_max": round(self.lag_max, 6),
                "backlog": self.backlog, "updated_at": time.time()}

    def write(self, home) -> None:
        path = stats_path(home, self.model)
        path.parent.mkdir(parents=True, exist_ok=True)
        write_json(path, self.to_json())
