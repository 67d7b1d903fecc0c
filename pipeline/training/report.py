"""The run report: one self-contained HTML page per run directory, ``RUN_DIR/report.html``.

Its header says first what users get after the run (the served candidate, its holdout metric
with a bootstrap interval over users, queries or events, its lift over the best trivial
model), then every other candidate scored, and why the gate chose
(:mod:`pipeline.training.report_wording`). Then four figures (matplotlib, inlined as base64
PNG: no external URL, no JavaScript, so the file can be mailed or attached to a ticket and
still opens):

1. the **validation curves** of what the run tried (the λ path, the tuner, each challenger's
   search, the blend's weight): per parameter, the validation metric over the values tried
   (a log axis when they span a decade), the chosen value starred
   (:mod:`pipeline.training.report_curves`);
2. the holdout **metric of every candidate** (served one on top, intervals as error bars)
   against the trivial models, in words too when the model is no better than the best one;
3. **warm vs cold** fit time and quality across the model's kept runs (``runs/{model}/*``,
   ordered by ``trained_at``), the evidence that warm starts pay;
4. the window's **dropped share**: of the events stored, how many the dataset left out and
   why (outside the window, out of range, replaced by a later event for the same key).

A piece the run does not have (no challenger, no tuner, no gate yet) is a one-line note
instead of a figure. Every text put into the page is escaped and URLs in it are redacted.
What the page shows is read from the run directory (:mod:`pipeline.training.report_data`);
this module only writes it as HTML and figures. The retrain's
:func:`~pipeline.training.steps.report_step` writes it (it never fails a run); ``rankstream
report MODEL`` opens the latest run's page.

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
from pipeline.training.report_curves import Curve, parameter_plots, validation_curves
from pipeline.training.report_data import (
    Run,
    decision,
    dropped_events,
    gate_metric,
    higher_is_better,
    load_run,
    metric_bars,
    other_drops,
    sibling_runs,
    verdict,
    warm_cold_points,
)
from pipeline.training.report_plots import plot_parameter
from pipeline.training.report_wording import (
    candidates,
    interval_method,
    number,
    ranked,
    served_rows,
    served_sentences,
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

def _header(run: Run, metric: str | None, higher: bool) -> str:
    tr, ds = run.train, run.dataset
    verdict, reason = decision(run)
    what, why = served_sentences(tr, run.gate, run.published, algorithm=run.algorithm)
    window = ds.get("window") or {}
    warm_from = ds.get("warm_from")
    rows = (served_rows(tr, run.gate, run.published, metric, higher)
            if metric is not None else [])
    rows += [("decision", verdict), ("model", run.model), ("algorithm", run.algorithm or "?"),
             ("run", run.path.name), ("trained at", tr.get("trained_at", "?")),
             ("start", f"warm, from checkpoint {Path(warm_from).name}" if tr.get("warm_start")
              and warm_from else ("warm" if tr.get("warm_start") else "cold"))]
    if window:
        rows.append(("window", f"{window.get('n_events', 0):,} events, "
                               f"{_iso_ms(window.get('min_ts'))} .. "
                               f"{_iso_ms(window.get('max_ts'))}"))
    if tr.get("warm_start_failed"):
        rows.append(("warm start failed", tr["warm_start_failed"]))
    if interval_method(tr):
        rows.append(("intervals", interval_method(tr)))
    body = "".join(f"<tr><th>{_text(k)}</th><td>{_text(v)}</td></tr>" for k, v in rows)
    notes = (f"<details><summary>the gate's notes, step by step</summary>{_note(reason)}"
             "</details>\n" if reason else "")
    # what the solver said about its fit (a degenerate TopPush: why, and what can help), once
    notes += "".join(_note(said, "warning") for said in tr.get("warnings", []))
    return (f"<header>\n<h1>{_text(run.model)}: run report</h1>\n"
            f'<p class="lead">{_text(what[:1].upper() + what[1:])}</p>\n{_note(why)}\n'
            f'<table class="summary">{body}</table>\n{notes}</header>')


# ------------------------------------------------------------------ 1. validation curves

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
    plots = [plot for curve in curves for plot in parameter_plots(curve)]
    if not plots:
        body.insert(0, _note("skipped: this run tried no settings (no λ path, tuner or "
                             "challenger search)"))
        return _section("validation-curve", "Validation curve", "\n".join(body))
    ncols = 1 if len(plots) == 1 else 2 if len(plots) <= 4 else 3
    nrows = math.ceil(len(plots) / ncols)
    fig, axes = _new_figure((3.0 if ncols < 3 else 2.5) * nrows, ncols=ncols, nrows=nrows)
    for ax, plot in zip(axes, plots):
        plot_parameter(ax, plot, metric, higher, color=COLORS["curve"],
                       chosen_color=COLORS["chosen"])
    for ax in axes[len(plots):]:
        ax.set_visible(False)
    direction = "higher" if higher else "lower"
    body.insert(0, _img(fig, f"validation {metric} over the values tried of each parameter"))
    body.insert(1, _note(f"Each plot is one parameter of one search: the validation {metric} "
                         f"({direction} is better) of each value tried, fitted without the "
                         "validation rows and scored on them; where the search varied other "
                         "parameters too, the dots are every setting and the line the best "
                         "at each value. The star is the value the run chose."))
    body += [_settings_table(c) for c in curves if c.table]
    return _section("validation-curve", "Validation curve", "\n".join(body))


# ----------------------------------------------------------- 2. metric vs trivial models

def _bars_section(run: Run, metric: str | None, higher: bool) -> str:
    title = "Metric against the trivial models and the challengers"
    if metric is None:
        return _section("metric-bars", title, _note("skipped: the run's gate metric is unknown"))
    served = (run.gate or {}).get("publishes")
    found = [c for c in ranked(candidates(run.train, metric), higher) if c.value is not None]
    found.sort(key=lambda c: c.choice != served)      # what is served on top, then the best
    if not found:
        return _section("metric-bars", title,
                        _note(f"skipped: no model has a holdout {metric} in this run"))
    fig, (ax,) = _new_figure(0.9 + 0.45 * len(found))
    y = list(range(len(found)))[::-1]
    spans = [c.interval for c in found]
    ax.barh(y, [c.value for c in found], color=[COLORS[c.role] for c in found],
            edgecolor=["black" if c.choice == served else "none" for c in found],
            linewidth=1.5, height=0.7)
    if any(spans):
        # at least 0: an interval is kept to 5 decimals, a value to more (a constant
        # column's interval is the value itself, rounded)
        lo = [max(c.value - s[0], 0.0) if s else 0.0 for c, s in zip(found, spans)]
        hi = [max(s[1] - c.value, 0.0) if s else 0.0 for c, s in zip(found, spans)]
        ax.errorbar([c.value for c in found], y, xerr=[lo, hi], fmt="none", ecolor="black",
                    elinewidth=1, capsize=3)
    labels = [c.short + (" (served)" if c.choice == served else "") for c in found]
    ax.set_yticks(y, labels, fontsize=9)
    for tick, c in zip(ax.get_yticklabels(), found):
        tick.set_fontweight("bold" if c.choice == served else "normal")
    for yi, c in zip(y, found):
        ax.annotate(number(c.value, c.interval), (c.interval[1] if c.interval else c.value, yi),
                    textcoords="offset points", xytext=(4, 0), va="center", fontsize=8)
    ax.set_xlabel(f"holdout {metric} ({'higher' if higher else 'lower'} is better)"
                  + (f"; bars: 95% bootstrap interval over "
                     f"{(run.train.get('holdout_intervals') or {}).get('unit', 'users')}"
                     if any(spans) else ""))
    ax.margins(x=0.2)
    ax.grid(axis="x", alpha=0.3)
    words, warning = verdict(metric_bars(run, metric), metric, higher)
    body = [_img(fig, f"holdout {metric} of the model, its challengers and the trivial models"),
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
p.lead { font-size: 16px; font-weight: 600; }
p.warning { background: #fff1d6; border-left: 4px solid #e0a000; padding: 4px 8px; }
details { font-size: 13px; margin: 4px 0; }
"""


def render(run: Run, runs_root: Path) -> str:
    """The report page of ``run`` as HTML text."""
    siblings = sibling_runs(run, runs_root)
    metric = gate_metric(run, siblings)
    higher = higher_is_better(run.algorithm, metric) if metric else True
    sections = [_header(run, metric, higher),
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
