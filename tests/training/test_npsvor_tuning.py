"""NPSVOR's tuner (pipeline/training/trainers/npsvor_tuning.py): C1 and the loss chosen on a
validation part of the training events, kept across warm runs until the events grew a
quarter, the config's settings when the validation part cannot choose. Pure logic: no servers
(the retrain through the product is in test_ordinal.py)."""

from __future__ import annotations

import numpy as np
import pytest

from pipeline.training.config import parse_model
from pipeline.training.trainers import npsvor_tuning
from pipeline.training.trainers.npsvor import metric_score
from pipeline.training.tuning import validation_mask
from solvers import NPSVOR

SCALE = 0.02   # features this small need C ≈ 1 / SCALE² to reach the margins


def _cfg(**tune):
    return parse_model("reviews", {"algorithm": "npsvor", "kinds": ["ordinal"],
                                   "params": {"C1": 1.0, "tol": 0.01, "random_state": 0,
                                              "n_threads": 1},
                                   "tune": tune}, "test")


def _model(cfg):
    return NPSVOR(**cfg.family.estimator_params(cfg.params))


_score = metric_score("mae")


def _tiny_features(n=1500, seed=0):
    """Ranks 1..5 from a planted direction, with features scaled by SCALE."""
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(n, 5))
    y = np.digitize(X @ np.array([1.0, -0.5, 0.8, 0.0, 0.3]), [-1.2, -0.4, 0.4, 1.2]) + 1
    return SCALE * X, y, np.arange(n, dtype=np.int64) * 7919


def _tune(cfg, X, y, ids, warm=None, model=None):
    model = model or _model(cfg)
    return model, npsvor_tuning.tune(model, X, y, ids, cfg, _score, False, warm)


def test_the_tuner_finds_the_large_C_that_tiny_features_need():
    cfg = _cfg(max_settings=12)
    X, y, ids = _tiny_features()
    model, tuning = _tune(cfg, X, y, ids)
    assert tuning["source"] == "tuned" and len(tuning["tried"]) <= 12
    assert tuning["choice"]["C1"] >= 8.0, tuning
    assert (model.C1, model.loss) == (tuning["choice"]["C1"], tuning["choice"]["loss"])
    scored = {(t["params"]["C1"], t["params"]["loss"]): t["validation"]
              for t in tuning["tried"]}
    assert tuning["validation"] == min(scored.values())
    # the config's own setting was scored first, and the choice beats it by far on validation
    assert tuning["tried"][0]["params"] == {"C1": 1.0, "loss": "hinge"}
    assert tuning["validation"] < scored[(1.0, "hinge")] - 0.3
    # every fit was on the rest of the training rows, scored on the validation fifth
    val = validation_mask(ids, 0)
    refit = NPSVOR(**{**model.get_params()}).fit(X[~val], y[~val], ids=ids[~val])
    assert _score(refit, X[val], y[val]) == pytest.approx(tuning["validation"])


def test_a_warm_run_keeps_the_choice_until_the_events_grew_a_quarter():
    cfg = _cfg(max_settings=6)
    X, y, ids = _tiny_features(n=2000)
    n0 = 1500
    _, first = _tune(cfg, X[:n0], y[:n0], ids[:n0])
    warm = npsvor_tuning.checkpoint_arrays(first)
    assert int(warm["tuned_n"]) == n0

    grown = int(1.2 * n0)
    model, kept = _tune(cfg, X[:grown], y[:grown], ids[:grown], warm=warm)
    assert kept["source"] == "last tuning" and kept["tried"] == []
    assert kept["choice"] == first["choice"] and model.C1 == first["choice"]["C1"]
    assert npsvor_tuning.checkpoint_arrays(kept)["tuned_n"] == n0   # growth counts from n0

    _, again = _tune(cfg, X, y, ids, warm=warm)   # 2000 > 1.25 x 1500
    assert again["source"] == "tuned"
    assert again["tried"][0]["params"] == first["choice"]   # the search restarts there


def test_a_rank_only_in_the_validation_part_leaves_the_config_settings():
    cfg = _cfg()
    X, y, ids = _tiny_features(n=800, seed=1)
    y = np.where(y == 5, 4, y)
    val = validation_mask(ids, 0)
    y[np.flatnonzero(val)[0]] = 5    # rank 5's only event is a validation event
    model, tuning = _tune(cfg, X, y, ids)
    assert tuning["source"] == "config"
    assert "rank 5 has no event outside the validation part" in tuning["tried"][0]["skipped"]
    assert (model.C1, model.loss) == (1.0, "hinge")
    assert npsvor_tuning.checkpoint_arrays(tuning) == {}


def test_the_config_own_C1_joins_the_grid():
    cfg = _cfg(C1=[0.5, 2.0])
    model = _model(cfg)
    model.set_params(C1=0.75)
    assert npsvor_tuning.grids(cfg, model) == {"C1": [0.5, 0.75, 2.0],
                                               "loss": ["hinge", "squared_hinge"]}


@pytest.mark.parametrize("tune, said", [
    ({"loss": ["l2"]}, "tune.loss: loss is 'l2', expected one of ['hinge', 'squared_hinge']"),
    ({"C1": [1, -2]}, "tune.C1: C1 is -2, expected a finite number > 0"),
    ({"C1": []}, "tune.C1 is [], expected a non-empty list"),
])
def test_a_bad_grid_is_refused_in_one_line_naming_it(tune, said):
    with pytest.raises(ValueError) as err:
        _cfg(**tune)
    assert said in str(err.value) and "\n" not in str(err.value)
