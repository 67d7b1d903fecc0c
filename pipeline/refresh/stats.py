"""What a refresher reports (``rankstream metrics`` and ``/metrics`` export it): the refresh
lag of each live event (its timestamp → its user's keys written), users refreshed, events,
flips re-applied, heals, and the Kafka backlog per partition. Kept as one JSON file per
refresher, ``HOME/refresh/<model>@<member>.json`` (its consumer-group member id, reused by a
restarted one; ``<model>.json`` for one run outside a group), rewritten atomically every couple
of seconds; :func:`read_stats` reads a model's as one, so two refreshers of a model on one host
are both counted instead of overwriting each other."""

from __future__ import annotations

import bisect
import time
from dataclasses import dataclass, field
from pathlib import Path

from pipeline.durable import read_json, write_json

LAG_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1.0, 2.0, 5.0, 10.0, 30.0, 60.0)   # seconds, then +Inf


COUNTS = ("users_refreshed", "events", "replayed_users", "flips", "heals", "rejoins",
          "users_held")


def stats_path(home, model: str, member: str = "") -> Path:
    return Path(home) / "refresh" / (f"{model}@{member}.json" if member else f"{model}.json")


def read_stats(home, model: str) -> dict | None:
    """The stats every refresher of ``model`` last wrote here, as one (:func:`merge_stats`),
    or None."""
    folder = Path(home) / "refresh"
    parts = []
    for path in [folder / f"{model}.json", *sorted(folder.glob(f"{model}@*.json"))]:
        try:
            part = read_json(path)
        except ValueError:
            continue
        if part:
            parts.append(part)
    return merge_stats(parts) if parts else None


def merge_stats(parts: list[dict]) -> dict:
    """Several refreshers' stats as one: the counts and the lag histogram summed, the largest
    lag and version, each partition's backlog as its latest writer saw it, the rest (last
    heal, updated_at, ...) the latest writer's; ``members``: how many wrote.

    >>> a = {"events": 3, "lag_counts": [1, 2], "lag_sum": 0.5, "lag_max": 0.4, "version": 2,
    ...      "backlog": {"t/0": 5}, "updated_at": 1.0}
    >>> b = {**a, "events": 4, "lag_max": 0.9, "backlog": {"t/0": 1, "t/1": 0}, "updated_at": 2.0}
    >>> m = merge_stats([a, b])
    >>> m["events"], m["lag_counts"], m["lag_max"], m["backlog"], m["members"]
    (7, [2, 4], 0.9, {'t/0': 1, 't/1': 0}, 2)
    """
    parts = sorted(parts, key=lambda s: s.get("updated_at", 0.0))
    out = {**parts[-1], "members": len(parts), "backlog": {}}
    out.pop("member", None)       # one of several
    for key in COUNTS:
        out[key] = sum(s.get(key, 0) for s in parts)
    counts = [s["lag_counts"] for s in parts if s.get("lag_counts")]
    out["lag_counts"] = [sum(c) for c in zip(*counts)] if counts else []
    out["lag_sum"] = sum(s.get("lag_sum", 0.0) for s in parts)
    out["lag_max"] = max(s.get("lag_max", 0.0) for s in parts)
    versions = [s["version"] for s in parts if s.get("version") is not None]
    out["version"] = max(versions) if versions else None
    out["last_heal"] = max((s.get("last_heal") or "" for s in parts), default="")
    out["unkeyed"] = next((s["unkeyed"] for s in parts if s.get("unkeyed")), "")
    for s in parts:       # oldest first: a partition's latest owner says last
        out["backlog"].update(s.get("backlog") or {})
    return out


@dataclass
class RefreshStats:
    model: str
    member: str = ""               # the consumer-group member id, naming its file
    version: int | None = None
    users_refreshed: int = 0
    events: int = 0
    replayed_users: int = 0        # recomputed after a flip or a heal
    flips: int = 0
    heals: int = 0
    rejoins: int = 0               # stalled rebalances and partitionless stretches, joined again
    last_heal: str = ""
    nothing_to_refresh: str = ""   # why, for a version whose shape has no per-user state
    users_held: int = 0            # users whose histories it holds (its partitions' users)
    unkeyed: str = ""              # why it holds every user's: a partition not keyed by user
    lag_counts: list = field(default_factory=lambda: [0] * (len(LAG_BUCKETS) + 1))
    lag_sum: float = 0.0
    lag_max: float = 0.0
    backlog: dict = field(default_factory=dict)    # "topic/partition" -> messages behind

    def lag(self, seconds: float) -> None:
        """Count one live event's refresh lag."""
        seconds = max(0.0, seconds)
        self.lag_counts[bisect.bisect_left(LAG_BUCKETS, seconds)] += 1
        self.lag_sum += seconds
        self.lag_max = max(self.lag_max, seconds)

    def to_json(self) -> dict:
        return {"model": self.model, "member": self.member, "version": self.version,
                "users_refreshed": self.users_refreshed, "events": self.events,
                "replayed_users": self.replayed_users, "flips": self.flips,
                "heals": self.heals, "rejoins": self.rejoins, "last_heal": self.last_heal,
                "nothing_to_refresh": self.nothing_to_refresh,
                "users_held": self.users_held, "unkeyed": self.unkeyed,
                "lag_buckets": list(LAG_BUCKETS), "lag_counts": self.lag_counts,
                "lag_sum": round(self.lag_sum, 6), "lag_max": round(self.lag_max, 6),
                "backlog": self.backlog, "updated_at": time.time()}

    def write(self, home) -> None:
        path = stats_path(home, self.model, self.member)
        path.parent.mkdir(parents=True, exist_ok=True)
        write_json(path, self.to_json())
