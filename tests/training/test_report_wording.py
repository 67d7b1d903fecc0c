"""What a run says it serves, and how sure it is: the ``rankstream train`` summary and the
report header say plainly what users get and why, naming every challenger; a one-shot command
promises no retry; the tuning plots are over the values tried; holdout metrics carry a
bootstrap interval over users. A real retrain with two challengers and a blend against a real
redis-server, and hand-made run directories for the cases a real run rarely produces."""

from __future__ import annotations

import re
from html import unescape

import numpy as np
import pytest
from matplotlib.figure import Figure

from pipeline.cli import main
from pipeline.cli.train import format_summary
from pipeline.durable import read_json, write_json
from pipeline.ingest import synthetic
from pipeline.ingest.files import ingest_files
from pipeline.settings import Settings
from pipeline.training import retrain
from pipeline.training.bootstrap import percentile_interval, resampled_means
from pipeline.training.config import parse_model
from pipeline.training.report import write_report
from pipeline.training.report_curves import parameter_plots, validation_curves
from pipeline.training.report_data import load_run
from pipeline.training.report_intervals import intervals, per_user_topk
from pipeline.training.report_plots import plot_parameter
from solvers.metrics import topk_hit_metrics

METRIC = "topk_ndcg@10"
# the numbers: the blend served at 0.2213, the model (not served) at 0.1856
TRAIN = {"model": "movies", "warm_start": False, "fit_seconds": 1.0, "n_iter": 10,
         "trained_at": "2025-01-01T00:00:00+00:00",
         "metrics": {METRIC: 0.1856},
         "baselines": {"popularity": {METRIC: 0.2097}, "global": {METRIC: 0.15}},
         "challenger": {
             "name": "als", "metrics": {METRIC: 0.2101}, "fit_seconds": 2.0,
             "tried": [{"params": {"factors": 64, "regularization": 3.0}, "validation": 0.20},
                       {"params": {"factors": 64, "regularization": 30.0}, "validation": 0.21},
                       {"params": {"factors": 128, "regularization": 30.0}, "validation": 0.19},
                       {"params": {"blend_weight": 0.25}, "validation": 0.22},
                       {"params": {"blend_weight": 0.5}, "validation": 0.23},
                       {"chosen": {"factors": 64, "regularization": 30.0}, "source": "tuned"}],
             "others": [{"name": "ease", "metrics": {METRIC: 0.2050}, "fit_seconds": 0.5,
                         "tried": [{"params": {"lambda": 10.0}, "validation": 0.20},
                                   {"params": {"lambda": 100.0}, "validation": 0.21},
                                   {"params": {"lambda": 1.0}, "validation": 0.18},
                                   {"params": {"lambda": 1000.0}, "validation": 0.17},
                                   {"chosen": {"lambda": 100.0}, "source": "tuned"}]}],
             "blend": {"metrics": {METRIC: 0.2213}, "weight": 0.5, "name": "als+ease",
                       "pair": ["als", "ease"]}},
         "holdout_intervals": {
             "metric": METRIC, "users": 943, "resamples": 1000, "level": 0.95, "seed": 0,
             "candidates": {"blend-als+ease": {"value": 0.2213, "interval": [0.205, 0.238]},
                            "model": {"value": 0.1856, "interval": [0.171, 0.2]}},
             "lift_over": "popularity",
             "lift": {"blend-als+ease": {"value": 0.0116, "interval": [-0.004, 0.027]}}}}
RULE = {"tolerance": 0.01, "trivial_margin": 0.0, "if_trivial": "reject",
        "challenger_tolerance": 0.0, "challenger_mode": "blend"}


def _gate(publishes, candidate=None, *, version=None, value=None) -> dict:
    return {"metric": METRIC, "higher_is_better": True, "publish": publishes is not None,
            "publishes": publishes, "candidate": candidate or publishes, "rule": RULE,
            "served_before": {"version": version, "value": value},
            "trivial": {"popularity": 0.2097, "global": 0.15},
            "lift_over_trivial": {"popularity": 0.0116, "global": 0.0713},
            "reason": "the model's topk_ndcg@10 0.1856 loses to the challenger als's 0.2101 by "
                      "0.0245 (tolerance 0.0): serving als; the blend (weight 0.5) 0.2213 beats "
                      "every candidate: serving it (blend-als+ease); nothing served yet"}


def _summary(gate: dict, publish: dict | None, decision: str, train=TRAIN) -> dict:
    return {"model": "movies", "algorithm": "altsvm", "train": train, "gate": gate,
            "publish": publish, "decision": decision, "reason": gate.get("reason")}


# ------------------------------------------------------------------ the summary


def test_summary_names_every_challenger_and_says_once_what_is_served():
    text = format_summary(_summary(_gate("blend-als+ease"),
                                   {"published": True, "version": 3, "publish_seconds": 0.1},
                                   "published"))
    head, why = text.splitlines()[0], text.split("\n  fit")[0]
    assert head == ("model movies (altsvm): published version 3: users now get the blend of "
                    "als and ease, holdout topk_ndcg@10 0.2213 [0.205, 0.238].")
    why = " ".join(why.split())
    # every candidate with its metric, best first, and the rule that chose
    assert ("blend als+ease 0.2213, als 0.2101, trivial popularity 0.2097, ease 0.2050, the "
            "model 0.1856") in why
    assert "the blend beats every other candidate" in why
    assert "its lift over the best trivial model, popularity, is +0.0116 [-0.004, +0.027]" in why
    assert "nothing was served before" in why
    # no clause that serves something else, nor one that says nothing is served
    assert "serving als" not in text and "nothing served yet" not in text
    # one line per challenger, each of them, and the blend
    assert re.search(r"^  challenger als  +topk_ndcg@10 0\.2101 \(tuned: 3 settings", text, re.M)
    assert re.search(r"^  challenger ease +topk_ndcg@10 0\.2050 \(tuned: 4 settings", text, re.M)
    assert "  blend    als+ease (weight 0.5): topk_ndcg@10 0.2213 [0.205, 0.238]" in text
    assert "  publish  version 3 serves the blend of als and ease" in text


@pytest.mark.parametrize(("gate", "first", "why"), [
    (_gate(None, "challenger-als", version=2, value=0.25),
     "nothing published: version 2 stays served (holdout topk_ndcg@10 0.2500 when it was "
     "published).",
     "als (0.2101) is worse than the served version 2 (0.2500) by more than the tolerance 0.01"),
    (_gate("trivial-popularity", "model"),
     "published version 1: users now get the trivial popularity list, holdout topk_ndcg@10 "
     "0.2097.",
     "no challenger beats the model by more than the challenger tolerance 0"),
    (_gate("challenger-als", version=1, value=0.20),
     "published version 1: users now get als, holdout topk_ndcg@10 0.2101.",
     "als beats the model by 0.0245, more than the challenger tolerance 0, and the blend does "
     "not beat it"),
])
def test_summary_of_a_rejection_a_trivial_list_and_a_challenger(gate, first, why):
    published = ({"published": True, "version": 1, "publish_seconds": 0.1} if gate["publish"]
                 else {"published": False, "version": None})
    text = format_summary(_summary(gate, published,
                                   "published" if gate["publish"] else "rejected"))
    assert text.splitlines()[0] == f"model movies (altsvm): {first}"
    assert why in " ".join(text.split())


def test_a_run_that_lost_its_lease_says_it_was_fenced():
    published = {"published": False, "version": None, "fenced": True,
                 "reason": "the retrain lease (token 1) is no longer held"}
    text = format_summary(_summary(_gate("challenger-als"), published, "fenced"))
    assert text.splitlines()[0].startswith("model movies (altsvm): not published (fenced: the "
                                           "retrain lease (token 1) is no longer held)")


def test_a_trial_run_says_nothing_changed_and_lists_every_candidate():
    text = format_summary({"model": "movies", "algorithm": "altsvm", "train": TRAIN,
                           "decision": "trained"})
    assert "nothing changed for users" in text.splitlines()[0]
    assert "blend als+ease 0.2213 [0.205, 0.238]" in " ".join(text.split())


# ------------------------------------------------------------------ a one-shot command


def test_a_one_shot_command_promises_no_retry(tmp_path, capsys):
    code = main(["recommend", "movies", "u1", "--redis-url", "redis://127.0.0.1:1",
                 "--home", str(tmp_path)])
    err = capsys.readouterr().err
    assert code == 1 and len(err.strip().splitlines()) == 1, err
    assert "unavailable" in err and "next attempt" not in err
    assert "check that it is running" in err and "then try again" in err


# ------------------------------------------------------------------ the report


def _run_dir(tmp_path, gate: dict, published: dict | None, train=TRAIN):
    run_dir = tmp_path / "home" / "runs" / "movies" / "20250101T000000000000-0123456789ab"
    run_dir.mkdir(parents=True)
    write_json(run_dir / "train.json", train)
    write_json(run_dir / "gate.json", gate)
    if published is not None:
        write_json(run_dir / "published.json", published)
    return run_dir


def _header(page: str) -> str:
    return unescape(page.split("<header>")[1].split("</header>")[0])


def test_the_report_header_names_the_served_model_and_its_metric_first(tmp_path):
    run_dir = _run_dir(tmp_path, _gate("blend-als+ease"),
                       {"published": True, "version": 1, "reason": "r"})
    header = _header(write_report(run_dir).read_text())
    lead = re.search(r'<p class="lead">(.*?)</p>', header).group(1)
    assert lead == ("Published version 1: users now get the blend of als and ease, holdout "
                    "topk_ndcg@10 0.2213 [0.205, 0.238].")
    first_row = re.search(r"<tr><th>(.*?)</th><td>(.*?)</td></tr>", header).groups()
    assert first_row == ("serves", "the blend of als and ease: holdout topk_ndcg@10 0.2213 "
                                   "[0.205, 0.238]")
    assert "<th>lift over popularity</th><td>+0.0116 [-0.004, +0.027]</td>" in header
    # the served metric comes before the model's, and every challenger is named
    assert header.index("0.2213") < header.index("0.1856")
    others = re.search(r"<th>others scored</th><td>(.*?)</td>", header).group(1)
    assert others.startswith("als 0.2101, trivial popularity 0.2097, ease 0.2050, "
                             "the model 0.1856 [0.171, 0.200]")


def test_a_rejected_run_heads_with_the_version_that_stays(tmp_path):
    run_dir = _run_dir(tmp_path, _gate(None, "challenger-als", version=2, value=0.25),
                       {"published": False, "version": None, "reason": "r"})
    header = _header(write_report(run_dir).read_text())
    assert re.search(r"<tr><th>(.*?)</th><td>(.*?)</td></tr>", header).groups() == (
        "serves", "version 2 as before, holdout topk_ndcg@10 0.2500")
    assert "Nothing published: version 2 stays served" in header


# ------------------------------------------------------------------ tuning plots


def test_tuning_plots_are_over_the_values_tried_one_per_parameter(tmp_path):
    run = load_run(_run_dir(tmp_path, _gate("blend-als+ease"), None))
    curves, _ = validation_curves(run, higher=True)
    plots = {p.title: p for c in curves for p in parameter_plots(c)}
    assert set(plots) == {"challenger als: tuner · factors",
                          "challenger als: tuner · regularization",
                          "blend als+ease: weight", "challenger ease: tuner"}
    ease = plots["challenger ease: tuner"]
    assert ease.xs == [10.0, 100.0, 1.0, 1000.0] and ease.scale == "log"
    assert ease.xs[ease.chosen] == 100.0
    assert plots["challenger als: tuner · regularization"].xs == [3.0, 30.0, 30.0]
    assert plots["blend als+ease: weight"].scale == "linear"
    # drawn on the values, in their order, on a log axis, the chosen value starred
    ax = Figure().subplots()
    plot_parameter(ax, ease, METRIC, higher=True)
    line, star = ax.lines
    assert line.get_xdata().tolist() == [1.0, 10.0, 100.0, 1000.0]
    assert line.get_ydata().tolist() == [0.18, 0.20, 0.21, 0.17]
    assert (star.get_xdata().tolist(), star.get_ydata().tolist()) == ([100.0], [0.21])
    assert ax.get_xscale() == "log" and ax.get_xlabel().startswith("λ")
    # a search over several parameters: the dots are every setting, the line the best per value
    ax = Figure().subplots()
    plot_parameter(ax, plots["challenger als: tuner · regularization"], METRIC, higher=True)
    dots, profile, _ = ax.lines
    assert dots.get_xdata().tolist() == [3.0, 30.0, 30.0]
    assert (profile.get_xdata().tolist(), profile.get_ydata().tolist()) == ([3.0, 30.0],
                                                                            [0.20, 0.21])
    page = write_report(run.path).read_text()
    assert "setting tried (in order)" not in page


# ------------------------------------------------------------------ the bootstrap


def test_per_user_topk_is_what_topk_hit_metrics_averages():
    rng = np.random.default_rng(0)
    n_users, n_items, k = 60, 40, 10
    ranked = np.array([rng.permutation(n_items)[:k] for _ in range(n_users)])
    ranked[::7, -3:] = -1                                     # short lists pad with -1
    counts = rng.integers(0, 6, n_users)                      # some users hold out nothing
    indices = np.concatenate([rng.choice(n_items, c, replace=False) for c in counts])
    indptr = np.r_[0, np.cumsum(counts)]
    per_user = per_user_topk(ranked, indptr, indices, k)
    means = topk_hit_metrics(ranked, indptr, indices, k)
    assert per_user["users"].tolist() == np.flatnonzero(counts).tolist()
    for name in ("precision", "recall", "ndcg"):
        assert per_user[name].mean() == pytest.approx(means[name], abs=1e-12), name


def _hits(n_users: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return rng.binomial(10, 0.2, n_users) / 10.0


def test_the_interval_holds_the_estimate_is_seeded_and_narrows_with_more_users():
    small, large = _hits(200, 1), _hits(20_000, 1)
    lo, hi = percentile_interval(resampled_means(small, seed=0))
    assert lo < small.mean() < hi
    assert percentile_interval(resampled_means(small, seed=0)) == (lo, hi)    # seeded
    assert percentile_interval(resampled_means(small, seed=1)) != (lo, hi)
    big_lo, big_hi = percentile_interval(resampled_means(large, seed=0))
    assert big_lo < large.mean() < big_hi
    assert (big_hi - big_lo) < (hi - lo) / 5          # about 1/sqrt(100) as wide
    # about the textbook width: 2 x 1.96 standard errors
    assert hi - lo == pytest.approx(2 * 1.96 * small.std() / np.sqrt(small.size), rel=0.2)


def test_resampled_means_are_the_means_of_the_drawn_rows():
    # the counts-times-values product against its definition: the mean of each resample's
    # rows, drawn as the function draws them (one block of resamples at a time)
    from pipeline.training import bootstrap

    table = np.random.default_rng(5).random((3_000, 4))
    means = resampled_means(table, n_resamples=300, seed=7)
    rng, block = np.random.default_rng(7), bootstrap.MAX_CELLS // table.size
    drawn = np.vstack([table[rng.integers(0, 3_000, size=(min(block, 300 - s), 3_000))].mean(1)
                       for s in range(0, 300, block)])
    np.testing.assert_allclose(means, drawn, rtol=1e-12)
    np.testing.assert_allclose(resampled_means(table[:, 1], n_resamples=300, seed=7),
                               means[:, 1], rtol=1e-12)       # one column: the same draws


def test_the_lift_interval_is_paired_over_the_same_users():
    model = _hits(500, 2)
    same = intervals({"model": model, "trivial-popularity": model.copy()}, METRIC, True)
    assert same["lift"]["model"] == {"value": 0.0, "interval": [0.0, 0.0]}
    better = intervals({"model": model + 0.01, "trivial-popularity": model}, METRIC, True)
    assert better["lift"]["model"]["interval"] == [0.01, 0.01]    # paired: no spread at all
    lower = intervals({"model": model, "trivial-global": model + 0.02}, "mae", False)
    assert lower["lift"]["model"]["value"] == pytest.approx(0.02)   # in the metric's direction
    again = intervals({"model": model, "trivial-popularity": _hits(500, 3)}, METRIC, True)
    assert again == intervals({"model": model, "trivial-popularity": _hits(500, 3)}, METRIC,
                              True)


# ------------------------------------------------------------------ a real run


@pytest.fixture(scope="module")
def real_run(tmp_path_factory, redis_url) -> dict:
    """A published retrain of AltSVM with ALS and EASE as challengers and their blend."""
    home = tmp_path_factory.mktemp("wording-home")
    settings = Settings(home=home, namespace=f"wd{home.name[-8:]}")
    spec = {"algorithm": "altsvm", "kinds": ["rating"],
            "params": {"rank": 8, "item_bias": True, "max_iter": 30, "random_state": 0,
                       "n_threads": 1, "comparisons": "implicit", "implicit_per_user": 100},
            "evaluation": {"holdout": 4},
            "tune": {"budget_seconds": 5, "max_settings": 3, "challenger_settings": 4},
            "gate": {"tolerance": 0.02, "challenger": ["als", "ease"],
                     "challenger_mode": "blend"}}
    events = synthetic.rating_events(n_users=250, n_items=120, per_user=30, seed=3)
    ingest_files([synthetic.write_jsonl(events, home / "r.jsonl")], "rating",
                 settings=settings, progress=False)
    return retrain.run("movies", {"movies": parse_model("movies", spec, "test")},
                       settings=settings, redis_url=redis_url)


def test_a_real_run_keeps_intervals_and_says_what_it_serves(real_run):
    train, gate = real_run["train"], real_run["gate"]
    found = train["holdout_intervals"]
    assert read_json(f"{train['run_dir']}/train.json")["holdout_intervals"] == found
    assert found["metric"] == gate["metric"] and found["resamples"] == 1000
    assert {"model", "challenger-als", "challenger-ease", "trivial-popularity"} <= set(
        found["candidates"])
    for choice, entry in found["candidates"].items():
        lo, hi = entry["interval"]
        assert lo <= entry["value"] <= hi, choice
    served = found["candidates"][gate["publishes"]]
    assert served["value"] == pytest.approx(gate["value"], abs=1e-5)
    assert found["candidates"]["model"]["value"] == pytest.approx(gate["model_value"], abs=1e-5)
    text = format_summary(real_run)
    lo, hi = served["interval"]
    assert f"{gate['value']:.4f} [{lo:.3f}, {hi:.3f}]" in text.splitlines()[0]
    assert "challenger als " in text and "challenger ease " in text
    assert f"lift over the best trivial model, {found['lift_over']}, is" in " ".join(text.split())
    page = unescape(write_report(train["run_dir"]).read_text())
    header = page.split("<header>")[1].split("</header>")[0]
    assert f"holdout {gate['metric']} {gate['value']:.4f} [{lo:.3f}, {hi:.3f}]" in \
        re.search(r"<tr><th>serves</th><td>(.*?)</td>", header).group(1)


@pytest.mark.parametrize(("algorithm", "who"), [("kernel_ranksvm", "queries now get"),
                                               ("toppush", "lookups now get"),
                                               ("altsvm", "users now get")])
def test_the_first_sentence_names_who_gets_the_answers(algorithm, who):
    """Issue 51: a search model's summary said "users now get"; its answers are queries'."""
    summary = _summary(_gate("challenger-als", version=1, value=0.20),
                       {"published": True, "version": 1, "publish_seconds": 0.1}, "published")
    summary["algorithm"] = algorithm
    first = format_summary(summary).splitlines()[0]
    assert first.startswith(f"model movies ({algorithm}): published version 1: {who} "), first
