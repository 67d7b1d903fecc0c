"""Two refreshers of one model on one host each write their own stats file, and what
``rankstream metrics`` and ``rankstream models`` read is both of them (issue 53: several
refreshers per model; one file per model let the last writer hide the other)."""

from __future__ import annotations

from types import SimpleNamespace

from pipeline.refresh.gauges import RefreshCollector
from pipeline.refresh.stats import RefreshStats, read_stats


def test_each_refresher_writes_its_own_stats_and_they_are_read_as_one(tmp_path):
    one, two = RefreshStats("movies", member="m-0"), RefreshStats("movies", member="m-1")
    for stats, events, lags, backlog in ((one, 5, (0.2, 0.3), {"t/0": 4}),
                                         (two, 7, (1.5,), {"t/1": 0})):
        stats.events, stats.rejoins, stats.version, stats.backlog = events, 1, 3, backlog
        for lag in lags:
            stats.lag(lag)
        stats.write(tmp_path)
    assert sorted(p.name for p in (tmp_path / "refresh").iterdir()) == [
        "movies@m-0.json", "movies@m-1.json"]
    merged = read_stats(tmp_path, "movies")
    assert merged["members"] == 2 and merged["events"] == 12 and merged["rejoins"] == 2
    assert sum(merged["lag_counts"]) == 3 and merged["lag_max"] == 1.5
    assert merged["backlog"] == {"t/0": 4, "t/1": 0}
    assert read_stats(tmp_path, "other") is None
    families = {f.name: f for f in RefreshCollector(SimpleNamespace(home=tmp_path),
                                                     ["movies"]).collect()}
    assert [s.value for s in families["rankstream_refresh_events"].samples
            if s.name.endswith("_total")] == [12]
    assert {s.labels["partition"]: s.value
            for s in families["rankstream_refresh_backlog"].samples} == {"t/0": 4, "t/1": 0}
