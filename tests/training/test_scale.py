"""A retrain whose cost grows with the data: comparisons made from the met rows, never stored;
the steps of one process handing the dataset over in memory; searches on a sample of users."""

from __future__ import annotations

import numpy as np

from pipeline.ingest import synthetic
from pipeline.ingest.files import ingest_files
from pipeline.settings import Settings
from pipeline.training import retrain, steps
from pipeline.training.config import parse_model
from pipeline.training.datasets import TEST, TRAIN, VALIDATION
from pipeline.training.run_types import RunContext
from pipeline.training.trainers.altsvm_comparisons import budget_caps
from pipeline.training.trainers.altsvm_data import tuning_sample, tuning_view
from solvers.persist import read_bundle


def _config(**tune):
    spec = {"algorithm": "altsvm", "kinds": ["rating"],
            "params": {"rank": 4, "max_iter": 10, "random_state": 0, "n_threads": 1,
                       "comparisons": "implicit", "implicit_per_user": 200,
                       "implicit_max_per_positive": 5},
            "evaluation": {"split": "random", "fraction": 0.2}, "gate": {"tolerance": 0.5}}
    if tune:
        spec["tune"] = {"max_settings": 2, "challenger_settings": 2, "budget_seconds": 600,
                        "rank": [4], "loss": ["squared_hinge"], **tune}
    return {"movies": parse_model("movies", spec, "test")}


def _ingest(settings, n_users=120):
    events = synthetic.rating_events(n_users=n_users, n_items=80, per_user=12, seed=3)
    path = synthetic.write_jsonl(events, settings.home / "in" / "r.jsonl")
    ingest_files([path], "rating", settings=settings, progress=False)


def test_comparisons_are_handed_over_in_memory_and_made_again_the_same(tmp_path):
    settings = Settings(home=tmp_path / "home")
    _ingest(settings)
    models = _config()
    ctx = RunContext.of(models, "movies", settings)
    built: dict = {}
    ds = steps.dataset_step(ctx, hand_over=built)
    in_memory = built["arrays"]["comparisons"]
    _, stored = read_bundle(f"{ds['run_dir']}/dataset", fmt="rankstream.dataset")
    assert "comparisons" not in stored and "path_comparisons" not in stored
    assert ds["stats"]["comparisons"] == len(in_memory) > 0
    # a step in another process makes them again from the stored rows: the same bits
    trainer = models["movies"].family.new_trainer()
    again = trainer.comparisons(dict(stored), models["movies"])
    assert again.dtype == in_memory.dtype and np.array_equal(again, in_memory)
    # at most 5 per liked item (12 rated items, some liked, 80% outside the holdout): not 200
    per_user = np.bincount(in_memory[:, 0])
    assert 0 < per_user.max() <= 5 * 12


def test_train_step_in_memory_equals_train_step_from_the_bundle(tmp_path):
    fits = []
    for name in ("memory", "bundle"):
        settings = Settings(home=tmp_path / name)
        _ingest(settings)
        ctx = RunContext.of(_config(), "movies", settings)
        built: dict = {}
        ds = steps.dataset_step(ctx, hand_over=built)
        arrays = built["arrays"] if name == "memory" else None
        out = steps.train_step(ctx.at(ds["run_dir"]), trial=True, arrays=arrays)
        fits.append((out["objective"], out["n_iter"], out["metrics"]))
    assert fits[0] == fits[1]


def test_searches_fit_and_score_a_sample_of_users_and_the_summary_says_so(tmp_path):
    settings = Settings(home=tmp_path / "home")
    _ingest(settings, n_users=150)
    out = retrain.run("movies", _config(sample_users=40), settings=settings, publish=False)
    stats = out["dataset"]["stats"]
    assert stats["tuning_users"] == 40
    _, arrays = read_bundle(f"{out['dataset']['run_dir']}/dataset", fmt="rankstream.dataset")
    sample = arrays["tuning_users"]
    validating = np.unique(arrays["met_user"][arrays["met_part"] == VALIDATION])
    assert len(sample) == 40 and set(validating) <= set(sample)
    assert out["train"]["tuning"]["users"] <= 40          # what the search fitted
    view = tuning_view(dict(arrays))
    assert set(np.unique(view["met_user"])) == set(sample)
    # its popular losers by the sample's own counts (made from its rows), not the whole data's
    assert "loser_counts" in arrays and "loser_counts" not in view
    # every user's rows are still trained on and evaluated
    assert np.unique(arrays["met_user"][arrays["met_part"] == TRAIN]).size > 100
    assert (arrays["met_part"] == TEST).any()


def test_a_search_on_a_sample_checks_its_rank_against_the_next_on_every_user(tmp_path):
    """A sample's fits learn each item from a fraction of its rows and undervalue capacity: the
    chosen setting and the next larger rank are fitted on every user's TRAIN rows, and the
    cheapest within tolerance of the better is what the run fits and serves."""
    settings = Settings(home=tmp_path / "home")
    _ingest(settings, n_users=150)
    models = _config(sample_users=40, rank=[4, 8], tolerance=0.005)
    out = retrain.run("movies", models, settings=settings, publish=False)
    tuning = out["train"]["tuning"]
    searched = {t["params"]["rank"] for t in tuning["tried"]}
    confirmed = tuning["confirmed"]
    assert searched == {4} and [c["params"]["rank"] for c in confirmed] == [4, 8]
    assert all(c["validation"] is not None and c["seconds"] > 0 for c in confirmed)
    best = max(c["validation"] for c in confirmed)
    near = [c["params"]["rank"] for c in confirmed if c["validation"] >= best * (1 - 0.005)]
    assert tuning["choice"]["rank"] == out["train"]["rank"] == min(near)
    # a search on every user has nothing to undervalue: no check
    other = Settings(home=tmp_path / "whole")
    _ingest(other, n_users=150)
    whole = retrain.run("movies", _config(rank=[4, 8]), settings=other, publish=False)
    assert "confirmed" not in whole["train"]["tuning"]


def test_tuning_sample_is_stable_as_users_arrive():
    first = tuning_sample(np.arange(1_000), 100, seed=0)
    grown = tuning_sample(np.arange(1_100), 100, seed=0)
    assert len(set(first) & set(grown)) >= 85       # ~100 * 1000/1100 stay
    assert tuning_sample(np.arange(50), 100, seed=0) is None


def test_fold_in_draws_as_many_per_item_as_training_at_most():
    """A new user folded in gets training's comparisons per item: per_user spread over their
    items, at most max_per_positive each (training's implicit_max_per_positive)."""
    from pipeline.serving.item_queries import PairwiseFoldIn

    assert PairwiseFoldIn.per_item({"per_user": 1000}, 6) == 167
    assert PairwiseFoldIn.per_item({"per_user": 1000, "max_per_positive": 20}, 6) == 20
    assert PairwiseFoldIn.per_item({"per_user": 1000, "max_per_positive": 20}, 200) == 5
    spec = _config()["movies"]
    trainer = spec.family.new_trainer()

    class Fit:
        reg_, loss = 1.0, "squared_hinge"

    arrays = {"relevance": np.float64(4.0)}
    assert trainer.fold_in_spec(Fit(), arrays, spec)["max_per_positive"] == 5


def test_als_on_a_sample_fits_the_rows_and_columns_it_met():
    from scipy.sparse import csr_matrix

    from pipeline.training.trainers.als import fit_als, fit_als_on_met

    rng = np.random.default_rng(1)
    dense = (rng.random((30, 40)) < 0.3).astype(np.float32)
    dense[5] = 0          # a user and an item outside the sample
    dense[:, 7] = 0
    params = {"factors": 4, "regularization": 0.1, "alpha": 1.0}
    U, V = fit_als_on_met(csr_matrix(dense), params, iterations=3, seed=0)
    assert U.shape == (30, 4) and V.shape == (40, 4)
    assert not U[5].any() and not V[7].any()
    kept = np.delete(np.delete(dense, 5, axis=0), 7, axis=1)
    U2, V2 = fit_als(csr_matrix(kept), params, iterations=3, seed=0)
    assert np.array_equal(np.delete(U, 5, axis=0), U2)
    assert np.array_equal(np.delete(V, 7, axis=0), V2)


def test_a_comparison_budget_lowers_the_cap_per_liked_item_and_the_summary_counts_it(tmp_path):
    """Past ``implicit_max_comparisons`` the cap per liked item drops to the largest that
    fits: the fit's memory is bounded whatever the data's size; what was left out is counted,
    and a folded-in user gets the lowered cap too."""
    settings = Settings(home=tmp_path / "home")
    _ingest(settings)
    free = _config()
    budget = _config()
    budget["movies"] = parse_model("movies", {
        "algorithm": "altsvm", "kinds": ["rating"],
        "params": {**budget["movies"].params, "implicit_max_comparisons": 1500},
        "evaluation": {"split": "random", "fraction": 0.2}, "gate": {"tolerance": 0.5}}, "test")
    made = {}
    for name, models in (("free", free), ("budget", budget)):
        built: dict = {}
        ds = steps.dataset_step(RunContext.of(models, "movies", settings), hand_over=built)
        made[name] = (ds["stats"], built["arrays"])
    (stats_free, arrays_free), (stats, arrays) = made["free"], made["budget"]
    assert stats_free["comparisons"] > 1500 >= stats["comparisons"] > 1500 // 2
    assert stats["comparisons_dropped_implicit_budget"] > 0
    assert "comparisons_dropped_implicit_budget" not in stats_free
    per_item = np.bincount(arrays["comparisons"][:, 0] * 80 + arrays["comparisons"][:, 1])
    trainer = budget["movies"].family.new_trainer()

    class Fit:
        reg_, loss = 1.0, "squared_hinge"

    param = lambda name: budget["movies"].family.dataset_param(budget["movies"].params, name)  # noqa: E731
    made_with = budget_caps(arrays, param, (TRAIN, VALIDATION))[0]
    assert per_item.max() <= made_with < 5
    # the published fit learns from every met row: its cap, the folded-in user's, is no higher
    cap = trainer.fold_in_spec(Fit(), arrays, budget["movies"])["max_per_positive"]
    assert 1 <= cap <= made_with
    assert trainer.fold_in_spec(Fit(), arrays_free, free["movies"])["max_per_positive"] == 5


def test_comparison_caps_that_are_not_whole_numbers_are_refused_when_the_config_is_read():
    import pytest

    for value in (-5, "20M", 2.5e7):
        with pytest.raises(ValueError, match=r"implicit_max_comparisons is .*, expected a whole "
                                             r"number >= 0"):
            parse_model("movies", {"algorithm": "altsvm", "kinds": ["rating"],
                                   "params": {"implicit_max_comparisons": value}}, "test")


def test_loser_counts_stay_the_last_runs_until_the_datas_own_drift_past_a_tenth():
    """Popularity-sampled losers are drawn by counts the next run's dataset starts from: kept
    while the data's own counts lie within LOSER_DRIFT of them (total variation), so a warm
    start finds its comparisons again, and counted afresh once they moved further."""
    from pipeline.training.trainers.altsvm_comparisons import LOSER_DRIFT, loser_counts

    items = np.repeat(np.arange(4), [40, 30, 20, 10])
    first, drift = loser_counts(items, 4, None)
    assert first.tolist() == [40, 30, 20, 10] and drift == 0.0
    grown, drift = loser_counts(np.r_[items, 4, 4], 6, {"loser_counts": first})   # 2 new items
    assert grown.tolist() == [40, 30, 20, 10, 0, 0]
    assert drift == 0.5 * (2 / 102 + sum(abs(c / 102 - c / 100) for c in (40, 30, 20, 10)))
    swapped = np.repeat(np.arange(4), [10, 20, 30, 40])             # tastes turned over
    fresh, drift = loser_counts(swapped, 4, {"loser_counts": first})
    assert drift > LOSER_DRIFT and fresh.tolist() == [10, 20, 30, 40]


def test_a_warm_dataset_draws_its_losers_by_the_checkpoints_counts(tmp_path, redis_url):
    settings = Settings(home=tmp_path / "home")
    _ingest(settings)
    models = _config()
    models["movies"].params["implicit_sampling"] = "popularity"
    cold = retrain.run("movies", models, settings=settings, redis_url=redis_url)
    assert cold["decision"] == "published", cold.get("reason")
    _, first = read_bundle(f"{cold['dataset']['run_dir']}/dataset", fmt="rankstream.dataset")
    more = synthetic.rating_events(n_users=130, n_items=80, per_user=12, seed=4)[-40:]
    ingest_files([synthetic.write_jsonl(more, settings.home / "in" / "more.jsonl")], "rating",
                 settings=settings, progress=False)
    warm = retrain.run("movies", models, settings=settings, redis_url=redis_url)
    assert warm["dataset"]["warm_from"] and warm["train"]["warm_start"]
    _, second = read_bundle(f"{warm['dataset']['run_dir']}/dataset", fmt="rankstream.dataset")
    n = len(first["loser_counts"])
    assert 0 < warm["dataset"]["stats"]["loser_counts_drift"] <= 0.1
    assert np.array_equal(second["loser_counts"][:n], first["loser_counts"])
    met = second["met_part"] != TEST
    own = np.bincount(second["met_item"][met], minlength=len(second["item_ids"]))
    assert not np.array_equal(second["loser_counts"], own)
