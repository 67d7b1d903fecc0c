"""The retrain loop against a real redis-server: warm starts, the gate, idempotency, bad state."""

from __future__ import annotations

import time
import warnings
from pathlib import Path

import numpy as np
import pytest

from pipeline.ingest import synthetic
from pipeline.ingest.files import ingest_files
from pipeline.serving.artifact import ModelArtifact
from pipeline.serving.lookup import TopK
from pipeline.settings import Settings
from pipeline.training import retrain, steps
from pipeline.training.config import parse_model
from pipeline.training.run_types import RunContext
from solvers.pairs import popularity_cum
from solvers.persist import read_bundle


def _models(**overrides):
    specs = {
        "movies": {"algorithm": "altsvm", "kinds": ["rating"],
                   "params": {"rank": 8, "reg_ratio": 0.3, "item_bias": True, "max_iter": 40,
                              "tol": 1e-5, "random_state": 0, "n_threads": 1},
                   "evaluation": {"holdout": 4}, "gate": {"tolerance": 0.02}},
        "ads": {"algorithm": "toppush", "kinds": ["outcome"], "params": {"reg": 1.0},
                "gate": {"tolerance": 0.0}},
    }
    for name, extra in overrides.items():
        specs[name].update(extra)
    return {name: parse_model(name, spec, "test") for name, spec in specs.items()}


@pytest.fixture
def settings(tmp_path, redis_client):
    return Settings(home=tmp_path / "home", namespace=f"t{tmp_path.name[-12:]}")


def _ingest(events, settings, kind, name):
    path = synthetic.write_jsonl(events, settings.home / "in" / f"{name}.jsonl")
    ingest_files([path], kind, settings=settings, progress=False)


def _dataset(run: dict) -> dict:
    return read_bundle(f"{run['dataset']['run_dir']}/dataset", fmt="rankstream.dataset")[1]


def _ratings():
    events = synthetic.rating_events(n_users=300, n_items=150, per_user=30, seed=1)
    cut = int(len(events) * 0.95)
    return events[:cut], events[cut:]


def test_second_run_warm_starts_and_publishes_a_new_version(settings, redis_url):
    first, fresh = _ratings()
    # a fixed fraction of reg_max (no path), so that the claim measured is the warm start's
    # (fewer iterations from the previous duals, same objective)
    models = _models(movies={"params": {"rank": 8, "reg_ratio": 0.3, "item_bias": True,
                                        "max_iter": 100, "tol": 1e-4, "random_state": 0,
                                        "n_threads": 1}})
    _ingest(first, settings, "rating", "r0")
    run1 = retrain.run("movies", models, settings=settings, redis_url=redis_url)
    assert run1["decision"] == "published" and not run1["train"]["warm_start"]
    ids1 = _dataset(run1)["user_ids"]

    _ingest(fresh, settings, "rating", "r1")
    run2 = retrain.run("movies", models, settings=settings, redis_url=redis_url)
    cold = retrain.run("movies", models, settings=settings, redis_url=redis_url, cold=True,
                       publish=False)
    assert run2["train"]["warm_start"] and not cold["train"]["warm_start"]
    assert run2["train"]["n_iter"] < cold["train"]["n_iter"]
    assert run2["train"]["objective"] <= cold["train"]["objective"] * (1 + 1e-3)
    assert run2["decision"] == "published"
    assert run2["publish"]["version"] == run1["publish"]["version"] + 1
    ids2 = _dataset(run2)["user_ids"]
    assert (ids2[:len(ids1)] == ids1).all(), "ids seen in run 1 were renumbered"

    with TopK(redis_url, namespace=settings.namespace) as topk:
        rec = topk.recommend("movies", first[0]["user"], k=5)
    assert rec.version == run2["publish"]["version"] and len(rec.items) == 5


def test_default_altsvm_run_chooses_reg_on_the_path_and_reports_it(settings, redis_url):
    """No reg or reg_ratio in the config: the trainer walks the path from reg_max down, keeps
    the λ that scores best on validation and reports reg_max, the choice and the curve."""
    first, fresh = _ratings()
    _ingest(first, settings, "rating", "r0")
    models = _models(movies={"params": {"rank": 8, "item_bias": True, "max_iter": 40,
                                        "random_state": 0, "n_threads": 1}})
    train = retrain.run("movies", models, settings=settings, redis_url=redis_url)["train"]
    assert train["reg_source"] == "path" and len(train["path"]) >= 3
    assert 0 < train["reg"] < train["reg_max"]
    assert train["reg_ratio"] == pytest.approx(train["reg"] / train["reg_max"], rel=1e-3)
    best = max(train["path"], key=lambda p: p["score"])
    assert best["ratio"] == pytest.approx(train["reg_ratio"], rel=1e-3)
    _ingest(fresh, settings, "rating", "r1")      # a warm run re-uses the path's λ
    again = retrain.run("movies", models, settings=settings, redis_url=redis_url)["train"]
    assert again["warm_start"] and again["reg_source"] == "last path"


def test_same_window_publishes_nothing_new(settings, redis_url):
    first, _ = _ratings()
    _ingest(first, settings, "rating", "r0")
    models = _models()
    run1 = retrain.run("movies", models, settings=settings, redis_url=redis_url)
    run2 = retrain.run("movies", models, settings=settings, redis_url=redis_url)
    assert run1["decision"] == "published"
    assert run2["decision"] == "unchanged" and "train" not in run2


def test_cli_publishes_a_run_directory_that_already_published(settings, redis_url, capsys):
    """``rankstream publish MODEL RUN_DIR`` after the run published: its artifact now lives in
    the checkpoint that ``published.json`` names, and publishing it again makes a new version."""
    from pipeline.cli import main

    first, _ = _ratings()
    _ingest(first, settings, "rating", "r0")
    run = retrain.run("movies", _models(), settings=settings, redis_url=redis_url)
    assert run["decision"] == "published"
    run_dir = run["dataset"]["run_dir"]
    assert not (Path(run_dir) / "artifact").exists()
    assert main(["publish", "movies", run_dir, "--no-progress", "--redis-url", redis_url,
                 "--namespace", settings.namespace, "--home", str(settings.home)]) == 0
    assert f"version {run['publish']['version'] + 1}" in capsys.readouterr().out


def test_the_fold_in_draws_losers_by_the_counts_training_drew_by(settings, redis_url):
    """One rule for popularity-sampled losers: the artifact publishes the dataset's
    ``loser_counts`` and its fold-in spec says how training sampled; a lookup client folding
    a user in loads them with the factors."""
    first, _ = _ratings()
    _ingest(first, settings, "rating", "r0")
    models = _models(movies={"params": {**_models()["movies"].params,
                                        "implicit_sampling": "popularity"}})
    run = retrain.run("movies", models, settings=settings, redis_url=redis_url)
    art = ModelArtifact.load(Path(run["publish"]["checkpoint"]) / "artifact")
    counts = _dataset(run)["loser_counts"]
    assert art.fold_in["sampling"] == "popularity"
    assert np.array_equal(art.loser_counts, counts) and counts.sum() > 0
    with TopK(redis_url, namespace=settings.namespace) as topk:
        topk.fold_in("movies", art.item_ids[:3].tolist(), k=5)
        st = topk.versions.current_state("movies")
        assert np.array_equal(st.loser_cum, popularity_cum(counts, art.n_items))


def test_events_of_other_kinds_do_not_make_a_model_retrain(settings, redis_url):
    """The unchanged-window shortcut and the dataset snapshot look at the model's own event
    kinds only: new outcome events leave the ratings model's window unchanged."""
    first, _ = _ratings()
    _ingest(first, settings, "rating", "r0")
    models = _models()
    assert retrain.run("movies", models, settings=settings,
                       redis_url=redis_url)["decision"] == "published"
    _ingest(synthetic.outcome_events(n_items=500, seed=5), settings, "outcome", "o0")
    again = retrain.run("movies", models, settings=settings, redis_url=redis_url)
    assert again["decision"] == "unchanged", again.get("reason")


def test_evaluation_k_relevance_and_random_split_come_from_the_config(settings, redis_url):
    first, _ = _ratings()
    _ingest(first, settings, "rating", "r0")
    models = _models(movies={"evaluation": {"split": "random", "fraction": 0.25, "k": 5,
                                            "relevance": 5.0}})
    out = retrain.run("movies", models, settings=settings, redis_url=redis_url)
    stats = out["dataset"]["stats"]
    assert abs(stats["test"] / stats["ratings"] - 0.25) < 0.02
    assert set(out["train"]["metrics"]) == {"ndcg@5", "precision@5", "pairwise_accuracy",
                                            "topk_ndcg@5", "topk_precision@5", "topk_recall@5"}
    assert out["gate"]["metric"] == "topk_ndcg@5"
    strict = out["train"]["metrics"]["precision@5"]
    loose = retrain.run("movies", _models(movies={"evaluation": {
        "split": "random", "fraction": 0.25, "k": 5, "relevance": 3.0}}), settings=settings,
        redis_url=redis_url, cold=True, publish=False)["train"]["metrics"]["precision@5"]
    assert loose > strict  # more held-out ratings count as relevant at a lower threshold


def test_worse_model_is_not_published_and_old_version_keeps_serving(settings, redis_url):
    outcomes = synthetic.outcome_events(n_items=3000, seed=2)
    _ingest(outcomes, settings, "outcome", "o0")
    run1 = retrain.run("ads", _models(), settings=settings, redis_url=redis_url)
    assert run1["decision"] == "published"
    with TopK(redis_url, namespace=settings.namespace) as topk:
        before = topk.recommend("ads", None, k=10).items

    rng = np.random.default_rng(0)       # poison: later events flip labels at random
    poisoned = [{**e, "event_id": e["event_id"] + "-p", "ts": e["ts"] + 10**9,
                 "label": int(rng.random() < 0.5)} for e in outcomes]
    _ingest(poisoned, settings, "outcome", "o1")
    run2 = retrain.run("ads", _models(), settings=settings, redis_url=redis_url)
    assert run2["decision"] == "rejected" and "pos@top" in run2["reason"]
    with TopK(redis_url, namespace=settings.namespace) as topk:
        after = topk.recommend("ads", None, k=10)
    assert after.version == run1["publish"]["version"] and after.items == before


def _collapsed_movies(if_trivial, trivial_margin=0.0):
    """A movies model at λ = 1.5 reg_max without a bias: U = V = 0, every score 0."""
    return _models(movies={"params": {"rank": 4, "reg_ratio": 1.5, "item_bias": False,
                                      "max_iter": 20, "random_state": 0, "n_threads": 1},
                           "gate": {"tolerance": 0.02, "if_trivial": if_trivial,
                                    "trivial_margin": trivial_margin}})


@pytest.mark.filterwarnings("ignore::solvers.CollapseWarning")
def test_gate_refuses_a_model_no_better_than_popularity(settings, redis_url):
    first, _ = _ratings()
    _ingest(first, settings, "rating", "r0")
    run = retrain.run("movies", _collapsed_movies("reject"), settings=settings,
                      redis_url=redis_url)
    gate = run["gate"]
    assert "does not beat the trivial" in run["reason"]
    assert run["train"]["collapsed"]
    assert set(gate["trivial"]) == {"popularity", "global"}
    best = max(gate["trivial"], key=gate["trivial"].get)
    assert gate["lift_over_trivial"][best] < 0 and gate["value"] < gate["trivial"][best]
    # nothing was served: the best trivial list is, marked, rather than nothing
    assert run["decision"] == "published" and gate["publishes"] == f"trivial-{best}"
    with TopK(redis_url, namespace=settings.namespace) as topk:
        assert topk.recommend("movies", first[0]["user"], k=5).source == "trivial"
    # once something is served, "reject" keeps its meaning (a margin the lift's interval
    # falls short of: the shortfall is outside the noise)
    _, more = _ratings()
    _ingest(more, settings, "rating", "r1")
    run = retrain.run("movies", _collapsed_movies("reject", trivial_margin=0.05),
                      settings=settings, redis_url=redis_url)
    assert run["decision"] == "rejected" and "does not beat the trivial" in run["reason"]
    assert run["train"]["holdout_intervals"]["lift"]["model"]["interval"][1] < 0.05


@pytest.mark.filterwarnings("ignore::solvers.CollapseWarning")
def test_gate_can_publish_the_better_trivial_list_instead(settings, redis_url, redis_client):
    first, _ = _ratings()
    _ingest(first, settings, "rating", "r0")
    run = retrain.run("movies", _collapsed_movies("publish_trivial"), settings=settings,
                      redis_url=redis_url)
    gate = run["gate"]
    best = max(gate["trivial"], key=gate["trivial"].get)
    assert run["decision"] == "published" and gate["publishes"] == f"trivial-{best}"
    # what is served is that trivial model's ranking, the same for every user; the checkpoint
    # keeps it as its artifact, so that a Redis that lost it gets the same list back
    trivial = ModelArtifact.load(Path(run["publish"]["checkpoint"]) / "artifact")
    assert trivial.kind == "global_list"
    top = np.argsort(-trivial.item_scores, kind="stable")[:5]
    for expected_version in (run["publish"]["version"], 1):
        with TopK(redis_url, namespace=settings.namespace) as topk:
            a = topk.recommend("movies", first[0]["user"], k=5)
            b = topk.recommend("movies", first[-1]["user"], k=5)
        assert a.version == expected_version and a.source == "trivial"
        assert [i for i, _ in a.items] == [i for i, _ in b.items] == \
            trivial.item_ids[top].tolist()
        for key in redis_client.scan_iter(f"*{settings.namespace}:*"):   # Redis lost it
            redis_client.delete(key)
        again = retrain.run("movies", _collapsed_movies("publish_trivial"), settings=settings,
                            redis_url=redis_url)
        assert again["decision"] == "republished", again


def test_toppush_best_feature_baseline_on_imbalanced_binary_features():
    """The trivial best-feature ranking of TopPush's gate: with 5% positives and 0/1 features
    (where E[x²] < ((mean_pos + mean_neg)/2)² would give a NaN spread) it finds the planted
    feature and its scores are finite."""
    from scipy.sparse import csr_matrix

    from pipeline.training.registry import family
    from pipeline.training.trainers.toppush import TopPushTrainer

    rng = np.random.default_rng(0)
    n, d = 2000, 30
    y = (rng.random(n) < 0.05).astype(np.int8)
    X = (rng.random((n, d)) < 0.02).astype(np.float64)
    X[:, 7] = np.where(y == 1, rng.random(n) < 0.9, rng.random(n) < 0.05)
    X = csr_matrix(X)
    arrays = {"X_data": X.data, "X_indices": X.indices, "X_indptr": X.indptr,
              "X_shape": np.array(X.shape), "y": y, "test_mask": rng.random(n) < 0.3}
    cfg = parse_model("ads", {"algorithm": "toppush", "kinds": ["outcome"],
                              "evaluation": {"metric": "average_precision"}}, "test")
    (metrics, scores), = TopPushTrainer(family("toppush")).baselines(arrays, cfg).values()
    assert metrics["feature"] == 7 and metrics["average_precision"] > 0.3   # chance: 0.05
    assert np.isfinite(scores).all()


def test_corrupt_checkpoint_means_cold_start_with_a_warning(settings, redis_url):
    first, fresh = _ratings()
    _ingest(first, settings, "rating", "r0")
    # a lenient gate: the holdout moves with the data, and what is tested here is the start
    models = _models(movies={"gate": {"tolerance": 0.5}})
    run1 = retrain.run("movies", models, settings=settings, redis_url=redis_url)
    ckpt = run1["publish"]["checkpoint"]
    with open(f"{ckpt}/arrays.npz", "wb") as fh:
        fh.write(b"garbage")
    _ingest(fresh, settings, "rating", "r1")
    with pytest.warns(RuntimeWarning, match="corrupt|unreadable"):
        run2 = retrain.run("movies", models, settings=settings, redis_url=redis_url)
    assert not run2["train"]["warm_start"] and run2["decision"] == "published", run2.get("reason")


def test_empty_window_is_a_clear_no_data_outcome(settings, redis_url):
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        out = retrain.run("movies", _models(), settings=settings, redis_url=redis_url)
    assert out["decision"] == "no_data" and "train" not in out


def test_a_run_that_reuses_an_earlier_one_says_so_and_counts_its_own_time(settings):
    from pipeline.cli.train import format_summary

    first, _ = _ratings()
    _ingest(first, settings, "rating", "r0")
    began = time.time()
    one = retrain.run("movies", _models(), settings=settings, cold=True, publish=False)
    time.sleep(0.5)
    again = retrain.run("movies", _models(), settings=settings, cold=True, publish=False)
    assert again["dataset"]["reused"] and again["dataset"]["run_dir"] == one["dataset"]["run_dir"]
    assert again["seconds"] < time.time() - began - 0.5     # not since the first run began
    assert "reused   run " + Path(one["dataset"]["run_dir"]).name in format_summary(again)
    assert "reused" not in format_summary(one)


def test_retried_steps_are_idempotent(settings, redis_url):
    first, _ = _ratings()
    _ingest(first, settings, "rating", "r0")
    models = _models()
    ctx = RunContext.of(models, "movies", settings, redis_url)
    ds = steps.dataset_step(ctx)
    again = steps.dataset_step(ctx)
    assert again["run_dir"] == ds["run_dir"] and again.get("reused")
    t1 = steps.train_step(ctx.at(ds["run_dir"]))
    assert steps.train_step(ctx.at(ds["run_dir"])) == t1
    steps.gate_step(ctx.at(ds["run_dir"]))
    p1 = steps.publish_step(ctx.at(ds["run_dir"]))
    (settings.home / "runs" / "movies" / ds["run_key"] / "published.json").unlink()  # crash
    p2 = steps.publish_step(ctx.at(ds["run_dir"]))
    assert p2["version"] == p1["version"], "a retried publish wrote a second version"
