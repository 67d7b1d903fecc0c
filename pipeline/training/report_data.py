"""What a run's report shows, read and derived from the run directory; no HTML, no figures.

A run directory ``{home}/runs/{model}/{run_key}`` holds one JSON file per step of the retrain
loop that has run: ``train.json`` (the fit: holdout metrics, the trivial models', the λ path,
the tuner's and the challenger's tried settings, fit time, warm or cold start),
``dataset/`` (the dataset's manifest: the window and what the family's builder kept and left
out), ``gate.json`` and ``published.json``. A run without ``train.json`` was not trained and
has no report; any other file may be missing (a trial run is never gated), and each reader
here answers ``None``, ``{}`` or an empty list for it instead of failing.

The report (:mod:`pipeline.training.report`) turns these values into the page's text and
figures; what the run's searches tried is read in :mod:`pipeline.training.report_curves`, what
it serves and why is worded in :mod:`pipeline.training.report_wording`. Kept apart from it,
what the page claims (the gate's metric and decision, the best trivial model, the chosen
setting, the dropped share) is plain values that a test or ``rankstream report`` (which finds
a model's latest run here) can use without an HTML page.

Examples
--------
>>> import json, tempfile
>>> with tempfile.TemporaryDirectory() as tmp:
...     run_dir = Path(tmp) / "runs" / "ads" / "20250101T000000000000-0123456789ab"
...     run_dir.mkdir(parents=True)
...     train = {"model": "ads", "metrics": {"auc": 0.9}, "baselines": {"mean": {"auc": 0.5}}}
...     _ = (run_dir / "train.json").write_text(json.dumps(train))
...     run = load_run(run_dir)
...     latest = latest_run(Path(tmp) / "runs", "ads") == run_dir
>>> latest, run.gate is None
(True, True)
>>> bars = metric_bars(run, "auc")
>>> bars
[('model', 0.9, 'model'), ('trivial mean', 0.5, 'trivial')]
>>> verdict(bars, "auc", higher=True)
("The model's auc 0.9000 beats the best trivial model, mean (0.5000), by 0.4000.", False)
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

from pipeline.durable import read_json
from pipeline.training.run_types import DATASET_FORMAT
from solvers.persist import read_manifest

# What each family's dataset stats call the events it kept (one per key: a later event for the
# same key replaces the earlier one), and which stats count events left out as out of range.
KEPT_EVENTS = (("met", "comparison_events"), ("outcomes",), ("reviews",), ("judgments",))
OUT_OF_RANGE = {"ratings_out_of_range": "rating outside rating_range",
                "labels_out_of_range": "label outside 1..levels"}
# Other stats that count something left out (not events), in words; a stat not listed here
# whose name says it counts something dropped is shown by its name.
OTHER_DROPS = {
    "comparisons_dropped_explicit": "explicit comparisons over max_pairs_per_user",
    "comparisons_dropped_implicit": "implicit comparisons over max_pairs_per_user",
    "feature_values_over_max_features": "feature values with an index over max_features",
    "empty_rows": "rows with no feature and no text",
}


# ---------------------------------------------------------------------------------- the run

@dataclass
class Run:
    """What one run directory holds; ``None`` (or ``{}``) for a step that has not run."""

    path: Path
    train: dict
    dataset: dict = field(default_factory=dict)
    gate: dict | None = None
    published: dict | None = None

    @property
    def model(self) -> str:
        return self.train.get("model") or self.path.parent.name

    @property
    def algorithm(self) -> str | None:
        return self.dataset.get("algorithm")


def load_run(run_dir) -> Run | None:
    """The run in ``run_dir``, or None when it has no ``train.json`` (not trained yet)."""
    run_dir = Path(run_dir)
    train = read_json(run_dir / "train.json")
    if train is None:
        return None
    try:
        dataset = read_manifest(run_dir / "dataset", fmt=DATASET_FORMAT) or {}
    except ValueError:      # a dataset of another format: the report goes on without it
        dataset = {}
    return Run(run_dir, train, dataset, read_json(run_dir / "gate.json"),
               read_json(run_dir / "published.json"))


def sibling_runs(run: Run, runs_root: Path) -> list[Run]:
    """The model's trained runs under ``runs_root/{model}``, oldest ``trained_at`` first."""
    model_dir = Path(runs_root) / run.model
    runs = [r for p in sorted(model_dir.iterdir()) if p.is_dir() and not p.name.startswith(".")
            and (r := load_run(p)) is not None] if model_dir.is_dir() else []
    return sorted(runs, key=lambda r: str(r.train.get("trained_at", "")))


def models_with_runs(runs_root) -> list[str]:
    """Models that have at least one trained run under ``runs_root``."""
    root = Path(runs_root)
    if not root.is_dir():
        return []
    return sorted(p.name for p in root.iterdir()
                  if p.is_dir() and any(p.glob("*/train.json")))


def latest_run(runs_root, model: str) -> Path | None:
    """The newest run directory of ``model`` with a ``train.json`` (run directories are named
    by their start time, so the newest sorts last), or None."""
    if model not in models_with_runs(runs_root):    # also refuses "../x" and the like
        return None
    trained = sorted(p.parent for p in (Path(runs_root) / model).glob("*/train.json")
                     if not p.parent.name.startswith("."))
    return trained[-1] if trained else None


def gate_metric(run: Run, siblings: list[Run]) -> str | None:
    """The metric the gate compares: the run's gate says it; a run not gated yet (a trial run)
    takes its siblings'; else the family's default, when the run reports it."""
    for r in [run, *reversed(siblings)]:
        if r.gate and r.gate.get("metric"):
            return r.gate["metric"]
    try:
        from pipeline.training.registry import family

        metric = family(run.algorithm).evaluation["metric"]
    except (KeyError, TypeError, ValueError):
        return None
    return metric if metric in run.train.get("metrics", {}) else None


def higher_is_better(algorithm: str | None, metric: str) -> bool:
    """The metric's direction from the family's registry entry (error metrics otherwise)."""
    try:
        from pipeline.training.registry import family

        return family(algorithm).higher_is_better(metric)
    except (KeyError, TypeError, ValueError):
        return metric.split("@")[0] not in ("mae", "mse", "rmse", "log_loss")


def _better(a: float, b: float, higher: bool) -> bool:
    return a > b if higher else a < b


def finite_number(value) -> float | None:
    """A finite float, or None (a metric that could not be computed is None or NaN)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value) if math.isfinite(value) else None


# -------------------------------------------------------------------------------- decision

def decision(run: Run) -> tuple[str, str]:
    """``(decision, reason)`` in words: the publish step's outcome, else the gate's, else
    that the run was not gated (a trial run, or a run whose gate has not run yet)."""
    pub, gate = run.published, run.gate
    if pub is not None:
        if pub.get("published"):
            return f"published as version {pub.get('version')}", pub.get("reason", "")
        return "rejected (the served version stays)", pub.get("reason", "")
    if gate is not None:
        verdict = (f"the gate would publish {gate.get('publishes')}" if gate.get("publish")
                   else "the gate rejects it")
        return f"{verdict} (not published yet)", gate.get("reason", "")
    return "trained, not gated (a trial run, or the gate has not run yet)", ""


# ----------------------------------------------------------- 2. metric vs trivial models

def metric_bars(run: Run, metric: str) -> list[tuple[str, float, str]]:
    """``(label, value, role)`` for the model, every challenger, the blend and every trivial
    model that has the metric."""
    tr = run.train
    bars = []
    own = finite_number(tr.get("metrics", {}).get(metric))
    if own is not None:
        bars.append(("model", own, "model"))
    ch = tr.get("challenger") or {}
    for c in [ch, *ch.get("others", [])] if ch else []:
        value = finite_number((c.get("metrics") or {}).get(metric))
        if value is not None:
            bars.append((f"challenger {c.get('name')}", value, "challenger"))
    blend = ch.get("blend") or {}
    value = finite_number((blend.get("metrics") or {}).get(metric))
    if value is not None:
        pair = "+".join(blend.get("pair") or ["model", str(ch.get("name"))])
        bars.append((f"blend {pair}", value, "blend"))
    for name, metrics in sorted((tr.get("baselines") or {}).items()):
        value = finite_number((metrics or {}).get(metric))
        if value is not None:
            bars.append((f"trivial {name}", value, "trivial"))
    return bars


def verdict(bars: list, metric: str, higher: bool) -> tuple[str, bool]:
    """The comparison in words, and whether it is a warning (the model is no better than the
    best trivial model, or has no value)."""
    own = next((v for _, v, role in bars if role == "model"), None)
    trivial = [(label, v) for label, v, role in bars if role == "trivial"]
    if own is None:
        return f"The model has no {metric} (an empty or one-class holdout).", True
    if not trivial:
        return f"The model's {metric} is {own:.4f}; the run has no trivial model to compare.", False
    label, best = max(trivial, key=lambda lv: lv[1] if higher else -lv[1])
    if not _better(own, best, higher):
        return (f"The model's {metric} {own:.4f} is no better than the best trivial model, "
                f"{label.removeprefix('trivial ')} ({best:.4f}).", True)
    return (f"The model's {metric} {own:.4f} beats the best trivial model, "
            f"{label.removeprefix('trivial ')} ({best:.4f}), by {abs(own - best):.4f}.", False)


# --------------------------------------------------------------------- 3. warm vs cold

def _short_time(trained_at: str) -> str:
    try:
        return datetime.fromisoformat(trained_at).strftime("%m-%d %H:%M:%S")
    except (TypeError, ValueError):
        return str(trained_at)[:19]


def warm_cold_points(siblings: list[Run], metric: str) -> list[tuple]:
    """``(index, label, fit seconds or None, metric or None, warm)`` per run, in
    ``trained_at`` order."""
    return [(i, _short_time(r.train.get("trained_at", "?")),
             finite_number(r.train.get("fit_seconds")),
             finite_number(r.train.get("metrics", {}).get(metric)),
             bool(r.train.get("warm_start")))
            for i, r in enumerate(siblings)]


# ------------------------------------------------------------------ 4. dropped share

def dropped_events(dataset: dict) -> tuple[int, list[tuple[str, int, str]]]:
    """``(stored events, [(reason, events, colour role), ...])``: what became of every event
    stored for the model's kinds up to the run's snapshot. The window (``last_days`` /
    ``last_events``) leaves out the older ones; of the window's, a label or rating out of
    range is left out, and a later event for the same key (user and item, item, query and
    doc, or a re-sent event id) replaces an earlier one; the rest are kept."""
    window, stats = dataset.get("window") or {}, dataset.get("stats") or {}
    n_events = int(window.get("n_events") or 0)
    outside = int(window.get("n_dropped") or 0)
    parts = [("outside the window", outside, "outside")]
    out_of_range = 0
    for key, reason in OUT_OF_RANGE.items():
        if stats.get(key):
            parts.append((reason, int(stats[key]), "out_of_range"))
            out_of_range += int(stats[key])
    kept_keys = next((keys for keys in KEPT_EVENTS if all(k in stats for k in keys)), None)
    if kept_keys is None:        # a family whose stats do not say: the window is all we know
        parts.append(("in the window", n_events, "kept"))
        return n_events + outside, parts
    kept = sum(int(stats[k]) for k in kept_keys)
    parts.append(("replaced by a later event for the same key",
                  max(n_events - out_of_range - kept, 0), "replaced"))
    parts.append(("kept", kept, "kept"))
    return n_events + outside, parts


def other_drops(dataset: dict) -> list[tuple[str, int]]:
    """What the dataset left out besides events: keys outside the window (users, items,
    queries), comparisons over the per-user cap, feature values over max_features, rows left
    empty. Whatever a stat whose name says so counts, so a new family's show up too."""
    window, stats = dataset.get("window") or {}, dataset.get("stats") or {}
    found = [(f"{k.removesuffix('_dropped')} with no event in the window", int(v))
             for k, v in window.items()
             if k.endswith("_dropped") and k != "n_dropped" and isinstance(v, int)]
    found += [(OTHER_DROPS.get(k, k), int(v)) for k, v in stats.items()
              if isinstance(v, int) and not isinstance(v, bool) and k not in OUT_OF_RANGE
              and any(w in k for w in ("dropped", "over_max", "empty_rows"))]
    return found
