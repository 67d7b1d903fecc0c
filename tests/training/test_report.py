"""The run report (``report.html``): real runs of the retrain loop against a real redis-server
(a tuned AltSVM with its ALS challenger and a windowed dataset, TopPush with its logistic
challenger), hand-made run directories for what real runs rarely hold (missing steps, hostile
text), a real headless Chromium screenshot of a page, and ``rankstream report``."""

from __future__ import annotations

import base64
import io
import os
import re
import shutil
import subprocess
import warnings
from html.parser import HTMLParser
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from pipeline.cli import main
from pipeline.durable import write_json
from pipeline.ingest import synthetic
from pipeline.ingest.files import ingest_files
from pipeline.settings import Settings
from pipeline.training import retrain
from pipeline.training.config import parse_model
from pipeline.training.report import COLORS, REPORT_NAME, write_report
from pipeline.training.report_data import dropped_events
from pipeline.training.run_types import DATASET_FORMAT, RunContext
from pipeline.training.steps import report_step
from solvers.persist import write_bundle

SECTIONS = ("validation-curve", "metric-bars", "warm-cold", "dropped-share")
PNG_SRC = re.compile(r'src="data:image/png;base64,([A-Za-z0-9+/=]+)"')
WINDOW_EVENTS = 8000     # of 9,000 ratings: the window leaves the oldest out

MODELS = {
    "movies": {"algorithm": "altsvm", "kinds": ["rating"],
               "window": {"last_events": WINDOW_EVENTS},
               "params": {"rank": 8, "item_bias": True, "max_iter": 30, "random_state": 0,
                          "n_threads": 1, "comparisons": "implicit", "implicit_per_user": 100},
               "evaluation": {"holdout": 4},
               "tune": {"budget_seconds": 5, "max_settings": 6},
               "gate": {"tolerance": 0.02, "challenger": "als", "challenger_mode": "blend"}},
    "ads": {"algorithm": "toppush", "kinds": ["outcome"], "params": {"reg": 1.0},
            "evaluation": {"metric": "average_precision"}, "gate": {"challenger": "logistic"}},
}


@pytest.fixture(scope="module")
def runs(tmp_path_factory, redis_url):
    """Real runs in one home: movies published cold, then warm on fresh events, then a cold
    trial run (no gate); ads published once. ``{"home", "movies": [dirs], "ads": [dirs]}``."""
    home = tmp_path_factory.mktemp("report-home")
    settings = Settings(home=home, namespace=f"rep{home.name[-8:]}")
    models = {name: parse_model(name, spec, "test") for name, spec in MODELS.items()}
    ratings = synthetic.rating_events(n_users=300, n_items=150, per_user=30, seed=1)
    cut = int(len(ratings) * 0.95)

    def ingest(events, kind, name):
        path = synthetic.write_jsonl(events, home / "in" / f"{name}.jsonl")
        ingest_files([path], kind, settings=settings, progress=False)

    ingest(ratings[:cut], "rating", "r0")
    ingest(synthetic.outcome_events(n_items=1500, n_features=20, positive_rate=0.1, seed=0),
           "outcome", "o0")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")      # TopPush says when its fit is degenerate
        out = {"home": home, "movies": [], "ads": []}
        for model, kwargs in (("movies", {}), ("ads", {}), ("movies", None),
                              ("movies", {"cold": True, "publish": False})):
            if kwargs is None:
                ingest(ratings[cut:], "rating", "r1")
                kwargs = {}
            summary = retrain.run(model, models, settings=settings, redis_url=redis_url,
                                  **kwargs)
            out[model].append(Path(summary["dataset"]["run_dir"]))
    return out


@pytest.fixture(scope="module")
def tuned_report(runs) -> Path:
    """The report of the first movies run: a tuner, a challenger with a blend, a gate."""
    return write_report(runs["movies"][0])


def _pngs(page: str) -> list[Image.Image]:
    images = []
    for data in PNG_SRC.findall(page):
        image = Image.open(io.BytesIO(base64.b64decode(data, validate=True)))
        assert image.format == "PNG"
        image.load()
        images.append(image)
    return images


class _Tags(HTMLParser):
    """Every start tag and its attributes, to check what a page could run or fetch."""

    def __init__(self):
        super().__init__()
        self.tags = []

    def handle_starttag(self, tag, attrs):
        self.tags.append((tag, dict(attrs)))


def _tags(page: str) -> list:
    parser = _Tags()
    parser.feed(page)
    return parser.tags


def test_a_tuned_run_with_a_challenger_has_every_figure(tuned_report):
    page = tuned_report.read_text()
    for anchor in SECTIONS:
        assert f'<section id="{anchor}">' in page
    assert "skipped:" not in page
    images = _pngs(page)
    assert len(images) == 4 and all(im.width >= 600 and im.height >= 100 for im in images)
    # the tuner's and the challenger's searches, each with its chosen setting named
    assert "model: tuner" in page and "challenger als: tuner" in page
    assert "blend model+als: weight" in page
    assert page.count("<td>chosen</td>") == 3
    assert "published as version 1" in page
    # the window left the oldest ratings out, and the page says how many
    stored = int(len(synthetic.rating_events(n_users=300, n_items=150, per_user=30, seed=1))
                 * 0.95)
    assert f"outside the window</td><td>{stored - WINDOW_EVENTS:,}</td>" in page
    assert not re.search(r"https?://", page), "the page must not fetch anything"
    assert not any(tag == "script" or any(a.startswith("on") for a in attrs)
                   for tag, attrs in _tags(page))


def test_the_warm_vs_cold_runs_and_a_trial_run(runs):
    trial = runs["movies"][-1]
    page = write_report(trial).read_text()
    assert "trained, not gated" in page
    assert "1 warm run: " in page and "2 cold runs: " in page
    assert len(_pngs(page)) == 4       # the trial run's metric comes from its siblings' gate


def test_a_model_no_better_than_trivial_is_said_in_words(runs, tmp_path):
    # the real TopPush run: the words follow its numbers, whichever way they fall
    page = write_report(runs["ads"][0]).read_text()
    assert "challenger logistic: tuner" in page and len(_pngs(page)) == 4
    assert ("is no better than the best trivial model" in page) != ("beats the best" in page)
    # a run that loses to a trivial model, for certain
    run_dir = _hand_made(tmp_path, metrics={"auc": 0.6},
                         baselines={"popular": {"auc": 0.7}, "mean": {"auc": 0.5}},
                         gate={"metric": "auc", "publish": False, "reason": "r"})
    page = write_report(run_dir).read_text()
    assert ('<p class="warning">The model&#x27;s auc 0.6000 is no better than the best trivial '
            'model, popular (0.7000).</p>') in page


def _hand_made(tmp_path, *, dataset: dict | None = None, gate: dict | None = None,
               **train) -> Path:
    run_dir = tmp_path / "home" / "runs" / "m" / "20250101T000000000000-0123456789ab"
    run_dir.mkdir(parents=True)
    write_json(run_dir / "train.json", {"model": "m", "warm_start": False, "fit_seconds": 0.5,
                                        "trained_at": "2025-01-01T00:00:00+00:00", **train})
    if dataset is not None:
        write_bundle(run_dir / "dataset", {}, {"format": DATASET_FORMAT,
                                               "format_version": 1, **dataset})
    if gate is not None:
        write_json(run_dir / "gate.json", gate)
    return run_dir


def test_missing_pieces_are_one_line_notes(tmp_path):
    run_dir = _hand_made(tmp_path, metrics={})
    page = write_report(run_dir).read_text()
    for anchor in SECTIONS:
        section = page.split(f'<section id="{anchor}">')[1].split("</section>")[0]
        assert section.count('<p class="note">skipped: ') == 1, anchor
    assert "<img" not in page and "trained, not gated" in page


def test_every_text_is_escaped_and_urls_are_redacted(tmp_path):
    hostile = "<script>alert('x')</script>"
    run_dir = _hand_made(
        tmp_path, metrics={"auc": 0.8}, baselines={"<b>bold</b>": {"auc": 0.5}},
        challenger={"name": '<img src=x onerror="alert(1)">', "metrics": {"auc": 0.7},
                    "tried": [{"params": {"C": "<i>1</i>"}, "validation": 0.7},
                              {"params": {"C": "2"}, "validation": None, "skipped": hostile}]},
        dataset={"algorithm": "toppush", "window": {"n_events": 10, "n_dropped": 0,
                                                    "warning": "a & b <i>"},
                 "stats": {"outcomes": 9}},
        gate={"metric": "auc", "publish": False, "publishes": None,
              "reason": f"{hostile} via redis://:hunter2@cache:6379/0"})
    page = write_report(run_dir).read_text()
    assert "hunter2" not in page and "redis://:***@cache" in page
    assert "&lt;script&gt;alert(&#x27;x&#x27;)&lt;/script&gt;" in page
    assert "&lt;b&gt;bold&lt;/b&gt;" in page and "a &amp; b &lt;i&gt;" in page
    tags = _tags(page)
    assert {tag for tag, _ in tags} <= {"html", "head", "meta", "title", "style", "body",
                                        "header", "h1", "h2", "table", "thead", "tbody", "tr",
                                        "th", "td", "section", "p", "img", "details",
                                        "summary"}
    assert all(attrs["src"].startswith("data:image/png;base64,")
               for tag, attrs in tags if tag == "img")
    assert len(_pngs(page)) == 4


def test_dropped_events_account_for_every_stored_event():
    stored, parts = dropped_events({
        "window": {"n_events": 100, "n_dropped": 20, "users": 5, "users_dropped": 1},
        "stats": {"met": 60, "comparison_events": 5, "ratings_out_of_range": 10}})
    assert stored == 120
    assert parts == [("outside the window", 20, "outside"),
                     ("rating outside rating_range", 10, "out_of_range"),
                     ("replaced by a later event for the same key", 25, "replaced"),
                     ("kept", 65, "kept")]


def test_report_step_never_fails_a_run(tmp_path, caplog):
    run_dir = tmp_path / "home" / "runs" / "ads" / "untrained"
    run_dir.mkdir(parents=True)
    ctx = RunContext.of({"ads": parse_model("ads", MODELS["ads"], "test")}, "ads",
                                Settings(home=tmp_path / "home"), run_dir=run_dir)
    with caplog.at_level("WARNING", logger="pipeline.training.steps"):
        summary = report_step(ctx)
    assert summary["report"] is None and "no train.json" in summary["report_error"]
    assert "no report written" in caplog.text
    write_json(run_dir / "train.json", {"model": "ads", "metrics": {}})
    assert report_step(ctx)["report"] == str(run_dir / REPORT_NAME)


def _colour_rows(shot: np.ndarray, colour: str) -> np.ndarray:
    """Rows of the screenshot's pixels of ``colour`` (±2 per channel: PNG decoding and
    compositing may round)."""
    rgb = np.array([int(colour[i:i + 2], 16) for i in (1, 3, 5)])
    return np.nonzero(np.abs(shot - rgb).max(axis=2) <= 2)[0]


def test_a_real_chromium_renders_every_figure(chromium, tuned_report, tmp_path):
    shot_path = tmp_path / "report.png"
    done = subprocess.run(
        [chromium, "--headless=new", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
         "--no-first-run", f"--user-data-dir={tmp_path / 'profile'}",
         f"--screenshot={shot_path}", "--window-size=1200,2600", tuned_report.as_uri()],
        capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and shot_path.is_file(), done.stderr[-2000:]
    if os.environ.get("RANKSTREAM_KEEP_SCREENSHOT"):
        keep = Path.home() / "exp" / "report-screenshot.png"
        keep.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(shot_path, keep)
    shot = np.asarray(Image.open(shot_path).convert("RGB")).astype(np.int16)
    assert shot.shape == (2600, 1200, 3)
    wide = shot.astype(np.int32)
    packed = (wide[..., 0] << 16) | (wide[..., 1] << 8) | wide[..., 2]
    assert len(np.unique(packed)) > 300, "a blank or text-only page"
    assert (shot.sum(axis=2) < 3 * 250).mean() > 0.05
    # each figure's own colours are on screen, in the order of the sections
    centres = []
    for colour in ("curve", "chosen", "model", "challenger", "trivial", "warm", "cold", "kept",
                   "outside"):
        rows = _colour_rows(shot, COLORS[colour])
        assert len(rows) >= 50, f"the {colour} colour is not on the screenshot"
        centres.append(rows.mean())
    curve, _, model, _, _, warm, cold, kept, _ = centres
    assert curve < model < min(warm, cold) <= max(warm, cold) < kept


def test_cli_prints_the_latest_report_and_opens_it_only_when_asked(runs, capsys,
                                                                   monkeypatch):
    home, latest = str(runs["home"]), runs["movies"][-1]
    opened = []
    monkeypatch.setattr("webbrowser.open", opened.append)
    monkeypatch.setenv("DISPLAY", ":0")
    (latest / REPORT_NAME).unlink(missing_ok=True)
    assert main(["report", "movies", "--home", home, "--no-open"]) == 0
    assert capsys.readouterr().out.strip() == str(latest / REPORT_NAME)
    assert (latest / REPORT_NAME).read_text().startswith("<!DOCTYPE html>") and not opened
    (latest / REPORT_NAME).write_text("kept")       # written once; --rebuild writes it again
    assert main(["report", "movies", "--home", home]) == 0
    assert (latest / REPORT_NAME).read_text() == "kept"
    assert opened == [(latest / REPORT_NAME).as_uri()]
    assert main(["report", "movies", "--home", home, "--rebuild", "--no-open"]) == 0
    assert (latest / REPORT_NAME).read_text().startswith("<!DOCTYPE html>")
    monkeypatch.delenv("DISPLAY")
    monkeypatch.delenv("WAYLAND_DISPLAY", raising=False)
    capsys.readouterr()
    assert main(["report", "movies", "--home", home]) == 0     # no display: the path only
    assert len(opened) == 1 and capsys.readouterr().out.strip().endswith(REPORT_NAME)


def test_cli_unknown_model_is_one_line_and_exit_2(runs, capsys):
    assert main(["report", "nope", "--home", str(runs["home"])]) == 2
    captured = capsys.readouterr()
    assert captured.out == "" and len(captured.err.strip().splitlines()) == 1
    assert "'nope'" in captured.err and "models with runs: ads, movies" in captured.err
