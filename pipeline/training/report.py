"""The run report: one self-contained HTML page per run directory, ``RUN_DIR/report.html``.

A person deciding whether to trust a retrain looks for four things, and the page shows each as
a figure (matplotlib, inlined as base64 PNG: no external URL, no JavaScript, so the file can be
mailed or attached to a ticket and still opens):

1. the **validation curve** of what the run tried: the λ path, the tuner's settings and the
   challenger's, each setting's validation score with the chosen one marked;
2. the run's holdout **metric against every trivial model and the challenger** (and their
   blend), in words too when the model is no better than the best trivial model;
3. **warm vs cold** fit time and quality across the model's kept runs (``runs/{model}/*``,
   ordered by ``trained_at``), the evidence that warm starts pay;
4. the window's **dropped share**: of the events stored, how many the dataset left out and
   why (outside the window, out of range, replaced by a later event for the same key).

A header says which run it is and what the gate decided, with its reason. A piece the run does
not have (no challenger, no tuner, no gate yet) is a one-line note instead of a figure. Every
text put into the page is escaped and URLs in it are redacted; the run's JSON files hold no
Redis URL, and none is read here.

What the page shows is read from the run directory and derived in
:mod:`pipeline.training.report_data`; this module only writes it as HTML and figures. The
retrain's :func:`~pipeline.training.steps.report_step` writes it after its last step (it never
fails a run); ``rankstream report MODEL`` opens the latest run's page
(:func:`~pipeline.training.report_data.latest_run`).

Examples
--------
>>> import json, tempfile
>>> with tempfile.TemporaryDirectory() as tmp:
...     run_dir = Path(tmp) / "runs" / "ads" / "20250101T000000000000-0123456789ab"
...     run_dir.mkdir(parents=True)
...     train = {"model": "ads", "metrics": {"auc": 0.9}, "baselines": {"mean": {"auc": 0.5}},
...              "warm_start": False, "fit_seconds": 0.2, "trained_at": "2025-01-01T00:00:00"}
...     gate = {"metric": "auc", "publish": True, "reason": "beats mean 0.5000"}
...     _ = (run_dir / "train.json").write_text(json.dumps(train))
...     _ = (run_dir / "gate.json").write_text(json.dumps(gate))
...     page = write_report(run_dir).read_text()
>>> page.count('src="data:image/png;base64,')     # the bars and the warm/cold runs
2
>>> page.count('<p class="note">skipped: ')       # no search tried, no dataset summary
2
"""

from __future__ import annotations

import base64
import html
import io
import math
import os
from datetime import datetime, timezone
from pathlib import Path

from pipeline.settings import redact
from pipeline.training.report_data import (
    Curve,
    Run,
    decision,
    dropped_events,
    finite_number,
    gate_metric,
    higher_is_better,
    load_run,
    metric_bars,
    other_drops,
    sibling_runs,
    validation_curves,
    verdict,
    warm_cold_points,
)

REPORT_NAME = "report.html"

# One colour per role, each used by one figure only, so that a screenshot test can tell which
# figure rendered by its colours (tests/training/test_report.py).
COLORS = {
    "curve": "#4c72b0", "chosen": "#c44e52",                        # validation curves
    "model": "#dd8452", "trivial": "#9a9a9a", "challenger": "#55a868",  # metric bars
    "blend": "#8172b3",
    "warm": "#e07b00", "cold": "#1b9e9e",                            # warm vs cold
    "kept": "#6aaf6a", "outside": "#937860", "out_of_range": "#da8bc3",  # dropped share
    "replaced": "#ccb974",
}
FIGURE_WIDTH = 10.0     # inches at DPI: 1000 px, shown unscaled in the page's 1040 px column
DPI = 100


# ------------------------------------------------------------------------------- HTML bits

def _text(value) -> str:
    """Any value as page text: URLs' passwords redacted, then HTML-escaped."""
    return html.escape(redact(str(value)), quote=True)


def _note(text: str, kind: str = "note") -> str:
    return f'<p class="{kind}">{_text(text)}</p>'


def _section(anchor: str, title: str, body: str) -> str:
    return f'<section id="{anchor}">\n<h2>{_text(title)}</h2>\n{body}\n</section>'


def _table(header: list, rows: list) -> str:
    head = "".join(f"<th>{_text(h)}</th>" for h in header)
    body = "".join("<tr>" + "".join(f"<td>{_text(c)}</td>" for c in row) + "</tr>"
                   for row in rows)
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def _new_figure(height: float, ncols: int = 1, nrows: int = 1):
    """A figure and its axes. ``matplotlib.figure.Figure`` instead of pyplot: no global figure
    registry to leak into and no GUI backend to select, so the retrain loop's process (an
    Airflow worker, a notebook) keeps whatever backend it had; PNG output goes through Agg."""
    from matplotlib.figure import Figure

    fig = Figure(figsize=(FIGURE_WIDTH, height), dpi=DPI, layout="constrained")
    axes = fig.subplots(nrows, ncols, squeeze=False)
    return fig, [ax for row in axes for ax in row]


def _img(fig, alt: str) -> str:
    """The figure as an inline PNG ``<img>``; the figure is cleared after (frees its
    artists now rather than at garbage collection)."""
    buf = io.BytesIO()
    try:
        # no "Software" chunk: the page holds no URL at all, not even inside an image
        fig.savefig(buf, format="png", dpi=DPI, metadata={"Software": None})
    finally:
        fig.clear()
    data = base64.b64encode(buf.getvalue()).decode("ascii")
    return f'<img src="data:image/png;base64,{data}" alt="{_text(alt)}">'


def _fmt(value, digits: int = 4) -> str:
    return "none" if value is None else f"{value:.{digits}f}"


def _iso_ms(ms) -> str:
    if ms is None:
        return "?"
    return datetime.fromtimestamp(ms / 1000, tz=timezone.utc).isoformat(timespec="seconds")


# ---------------------------------------------------------------------------------- header

def _header(run: Run, metric: str | None) -> str:
    tr, ds, gate = run.train, run.dataset, run.gate or {}
    verdict, reason = decision(run)
    window = ds.get("window") or {}
    warm_from = ds.get("warm_from")
    rows = [("model", run.model), ("algorithm", run.algorithm or "?"),
            ("run", run.path.name), ("trained at", tr.get("trained_at", "?")),
            ("start", f"warm, from checkpoint {Path(warm_from).name}" if tr.get("warm_start")
             and warm_from else ("warm" if tr.get("warm_start") else "cold")),
            ("decision", verdict)]
    if gate.get("publishes"):
        rows.append(("serves", gate["publishes"]))
    if metric is not None:
        value = finite_number(tr.get("metrics", {}).get(metric))
        rows.append((f"holdout {metric}", _fmt(value)))
    if window:
        rows.append(("window", f"{window.get('n_events', 0):,} events, "
                               f"{_iso_ms(window.get('min_ts'))} .. "
                               f"{_iso_ms(window.get('max_ts'))}"))
    if tr.get("warm_start_failed"):
        rows.append(("warm start failed", tr["warm_start_failed"]))
    rows.append(("gate reason", reason or "(no gate yet)"))
    body = "".join(f"<tr><th>{_text(k)}</th><td>{_text(v)}</td></tr>" for k, v in rows)
    return (f"<header>\n<h1>{_text(run.model)}: run report</h1>\n"
            f'<table class="summary">{body}</table>\n</header>')


# ------------------------------------------------------------------ 1. validation curves

def _plot_curve(ax, curve: Curve, metric: str) -> None:
    x = list(range(len(curve.values)))
    ax.plot(x, curve.values, "-o", color=COLORS["curve"], markersize=5, linewidth=1.5)
    if curve.chosen is not None:
        c = curve.chosen
        ax.plot([c], [curve.values[c]], "*", color=COLORS["chosen"], markersize=18,
                label="chosen", zorder=3)
        ax.annotate("chosen", (c, curve.values[c]), textcoords="offset points",
                    xytext=(0, -18), ha="center", color=COLORS["chosen"], fontsize=9)
    ax.set_xticks(x, curve.ticks or [str(i + 1) for i in x], fontsize=8)
    ax.set_title(curve.title, fontsize=10)
    ax.set_xlabel(curve.xlabel, fontsize=9)
    ax.set_ylabel(f"validation {metric}", fontsize=9)
    ax.grid(alpha=0.3)
    ax.margins(x=0.06, y=0.2)


def _settings_table(curve: Curve) -> str:
    """What each numbered point of a curve was (only what varies: the rest is constant)."""
    varying = sorted({k for p in curve.settings for k in p
                      if len({repr(q.get(k)) for q in curve.settings}) > 1})
    rows = [(i + 1, ", ".join(f"{k}={p.get(k)}" for k in varying) or "(one setting)",
             f"{v:.4f}", "chosen" if i == curve.chosen else "")
            for i, (p, v) in enumerate(zip(curve.settings, curve.values))]
    table = _table(["#", "setting", "validation", ""], rows)
    return (f"<details><summary>{_text(curve.title)}: {len(rows)} settings</summary>"
            f"{table}</details>")


def _validation_section(run: Run, metric: str | None, higher: bool) -> str:
    if metric is None:
        return _section("validation-curve", "Validation curve",
                        _note("skipped: the run's gate metric is unknown"))
    curves, notes = validation_curves(run, higher)
    body = [_note(n) for n in notes]
    for curve in curves:
        if curve.skipped:
            body.append(_note(f"{curve.title}: {len(curve.skipped)} settings not scored "
                              f"({'; '.join(sorted(set(curve.skipped)))})"))
    if not curves:
        body.insert(0, _note("skipped: this run tried no settings (no λ path, tuner or "
                             "challenger search)"))
        return _section("validation-curve", "Validation curve", "\n".join(body))
    ncols = 1 if len(curves) == 1 else 2
    nrows = math.ceil(len(curves) / ncols)
    fig, axes = _new_figure(3.0 * nrows, ncols=ncols, nrows=nrows)
    for ax, curve in zip(axes, curves):
        _plot_curve(ax, curve, metric)
    for ax in axes[len(curves):]:
        ax.set_visible(False)
    direction = "higher" if higher else "lower"
    body.insert(0, _img(fig, f"validation {metric} of every setting tried"))
    body.insert(1, _note(f"Each point is a setting fitted without the validation rows and "
                         f"scored on them ({direction} is better); the star is the one the "
                         f"run chose."))
    body += [_settings_table(c) for c in curves if c.ticks is None]
    return _section("validation-curve", "Validation curve", "\n".join(body))


# ----------------------------------------------------------- 2. metric vs trivial models

def _bars_section(run: Run, metric: str | None, higher: bool) -> str:
    title = "Metric against the trivial models and the challenger"
    if metric is None:
        return _section("metric-bars", title, _note("skipped: the run's gate metric is unknown"))
    bars = metric_bars(run, metric)
    if not bars:
        return _section("metric-bars", title,
                        _note(f"skipped: no model has a holdout {metric} in this run"))
    fig, (ax,) = _new_figure(0.9 + 0.45 * len(bars))
    y = list(range(len(bars)))[::-1]       # the model on top
    ax.barh(y, [v for _, v, _ in bars], color=[COLORS[role] for _, _, role in bars],
            edgecolor=["black" if role == "model" else "none" for _, _, role in bars],
            linewidth=1.5, height=0.7)
    ax.set_yticks(y, [label for label, _, _ in bars], fontsize=9)
    for tick, (_, _, role) in zip(ax.get_yticklabels(), bars):
        tick.set_fontweight("bold" if role == "model" else "normal")
    for yi, (_, v, _) in zip(y, bars):
        ax.annotate(f"{v:.4f}", (v, yi), textcoords="offset points", xytext=(4, 0),
                    va="center", fontsize=8)
    ax.set_xlabel(f"holdout {metric} ({'higher' if higher else 'lower'} is better)")
    ax.margins(x=0.12)
    ax.grid(axis="x", alpha=0.3)
    words, warning = verdict(bars, metric, higher)
    body = [_img(fig, f"holdout {metric} of the model, its challenger and the trivial models"),
            _note(words, "warning" if warning else "note")]
    if not (run.train.get("challenger")):
        body.append(_note("The run has no challenger (gate.challenger = \"none\")."))
    return _section("metric-bars", title, "\n".join(body))


# --------------------------------------------------------------------- 3. warm vs cold

def _mean(values) -> float | None:
    values = [v for v in values if v is not None]
    return sum(values) / len(values) if values else None


def _warm_cold_words(points: list, metric: str) -> str:
    parts = []
    for name, warm in (("warm", True), ("cold", False)):
        mine = [p for p in points if p[4] == warm]
        if mine:
            seconds = _mean(p[2] for p in mine)
            quality = _mean(p[3] for p in mine)
            runs = "run" if len(mine) == 1 else "runs"
            parts.append(f"{len(mine)} {name} {runs}: mean fit {_fmt(seconds, 2)} s, mean "
                         f"{metric} {_fmt(quality)}")
    return "; ".join(parts) + "."


def _warm_cold_section(run: Run, siblings: list[Run], metric: str | None) -> str:
    title = "Warm vs cold across the model's runs"
    if metric is None:
        return _section("warm-cold", title, _note("skipped: the run's gate metric is unknown"))
    points = [p for p in warm_cold_points(siblings, metric)
              if p[2] is not None or p[3] is not None]
    if not points:
        return _section("warm-cold", title,
                        _note("skipped: no run of this model records its fit time or metric"))
    fig, (ax_time, ax_quality) = _new_figure(3.6, ncols=2)
    for warm, name, marker in ((True, "warm", "o"), (False, "cold", "s")):
        for ax, column in ((ax_time, 2), (ax_quality, 3)):
            mine = [p for p in points if p[4] == warm and p[column] is not None]
            ax.plot([p[0] for p in mine], [p[column] for p in mine], marker, linestyle="-",
                    color=COLORS[name], label=name, markersize=8)
    current = next((i for i, r in enumerate(siblings) if r.path == run.path), None)
    for ax, column in ((ax_time, 2), (ax_quality, 3)):
        here = [p for p in points if p[0] == current and p[column] is not None]
        if here:    # this report's run: ringed
            ax.plot([here[0][0]], [here[0][column]], "o", markersize=16, fillstyle="none",
                    color="black", label="this run")
        ax.set_xticks([p[0] for p in points], [p[1] for p in points], rotation=35,
                      ha="right", fontsize=8)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    ax_time.set_ylabel("fit seconds (tuning included)")
    ax_time.set_title("fit time", fontsize=10)
    ax_quality.set_ylabel(f"holdout {metric}")
    ax_quality.set_title("quality", fontsize=10)
    body = [_img(fig, f"fit time and holdout {metric} of warm and cold runs"),
            _note(_warm_cold_words(points, metric) + " The retrain loop keeps the newest "
                  "run directories only, so older runs are not shown.")]
    return _section("warm-cold", title, "\n".join(body))


# ------------------------------------------------------------------ 4. dropped share

def _dropped_section(run: Run) -> str:
    title = "The window's dropped share"
    if not run.dataset.get("window"):
        return _section("dropped-share", title,
                        _note("skipped: the run's dataset summary is missing"))
    stored, parts = dropped_events(run.dataset)
    if stored == 0:
        return _section("dropped-share", title, _note("skipped: the window holds no event"))
    fig, (ax,) = _new_figure(1.4 + 0.2 * math.ceil(len(parts) / 2))
    left = 0.0
    for reason, count, role in parts:
        share = count / stored
        ax.barh([0], [share], left=left, color=COLORS[role], height=0.6,
                label=f"{reason}: {count:,} ({share:.1%})")
        left += share
    ax.set_xlim(0, 1)
    ax.set_yticks([])
    ax.xaxis.set_major_formatter(lambda v, _: f"{v:.0%}")
    ax.set_xlabel(f"share of the {stored:,} stored events")
    fig.legend(loc="outside lower center", ncol=2, fontsize=8, frameon=False)
    dropped = sum(c for _, c, role in parts if role != "kept")
    body = [_img(fig, "what share of the stored events the dataset kept and dropped"),
            _note(f"The dataset dropped {dropped:,} of {stored:,} stored events "
                  f"({dropped / stored:.1%})."),
            _table(["events", "count", "share"],
                   [(r, f"{c:,}", f"{c / stored:.2%}") for r, c, _ in parts])]
    others = other_drops(run.dataset)
    if others:
        body.append(_note("Also left out:"))
        body.append(_table(["what", "count"], [(k, f"{v:,}") for k, v in others]))
    for source in (run.dataset.get("window") or {}, run.dataset.get("stats") or {}):
        if source.get("warning"):
            body.append(_note(source["warning"], "warning"))
    return _section("dropped-share", title, "\n".join(body))


# ------------------------------------------------------------------------------ the page

STYLE = """
body { font-family: system-ui, -apple-system, "Segoe UI", sans-serif; color: #222;
       background: #fff; margin: 0 auto; max-width: 1040px; padding: 12px 20px; }
h1 { font-size: 22px; margin: 4px 0 10px; } h2 { font-size: 17px; margin: 18px 0 6px; }
table { border-collapse: collapse; font-size: 13px; margin: 4px 0; }
th, td { border: 1px solid #ddd; padding: 3px 8px; text-align: left; vertical-align: top; }
table.summary th { background: #f3f3f3; width: 150px; }
img { display: block; max-width: 100%; }
p { margin: 4px 0; font-size: 14px; } p.note { color: #444; }
p.warning { background: #fff1d6; border-left: 4px solid #e0a000; padding: 4px 8px; }
details { font-size: 13px; margin: 4px 0; }
"""


def render(run: Run, runs_root: Path) -> str:
    """The report page of ``run`` as HTML text."""
    siblings = sibling_runs(run, runs_root)
    metric = gate_metric(run, siblings)
    higher = higher_is_better(run.algorithm, metric) if metric else True
    sections = [_header(run, metric),
                _validation_section(run, metric, higher),
                _bars_section(run, metric, higher),
                _warm_cold_section(run, siblings, metric),
                _dropped_section(run)]
    return ("<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n"
            f"<title>{_text(run.model)}: run {_text(run.path.name)}</title>\n"
            f"<style>{STYLE}</style>\n</head>\n<body>\n" + "\n".join(sections)
            + "\n</body>\n</html>\n")


def write_report(run_dir: Path, runs_root: Path | None = None) -> Path:
    """Write ``run_dir/report.html`` and return its path.

    Parameters
    ----------
    run_dir : path
        A run directory ``{home}/runs/{model}/{run_key}`` with a ``train.json``.
    runs_root : path, optional
        ``{home}/runs``, where the model's other runs are (default: two levels above
        ``run_dir``).

    Raises ``FileNotFoundError`` when the run has no ``train.json`` (it was not trained).
    """
    run_dir = Path(run_dir)
    run = load_run(run_dir)
    if run is None:
        raise FileNotFoundError(f"{run_dir} holds no train.json: the run was not trained")
    page = render(run, Path(runs_root) if runs_root is not None else run_dir.parent.parent)
    path = run_dir / REPORT_NAME
    tmp = path.with_name(f".{REPORT_NAME}.{os.getpid()}.tmp")
    tmp.write_text(page, encoding="utf-8")
    os.replace(tmp, path)      # a reader (the browser) never sees half a page
    return path
