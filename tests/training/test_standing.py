"""Which challengers a warm run refits (pipeline.training.trainers.standing): pure logic on
warm-state arrays."""

import numpy as np

from pipeline.training.trainers import standing
from pipeline.training.tuning import REUSE_GROWTH


def _warm(rows=1000.0, pair="model,ease", **values):
    warm = {standing.ROWS: np.array(rows), "blend_pair": np.array(pair)}
    warm.update({standing.STANDING + n: np.array(v) for n, v in values.items()})
    return warm


def test_a_challenger_far_behind_the_best_is_skipped_and_one_within_reach_is_not():
    warm = _warm(model=[0.170, 0.0005], blend=[0.1724, 0.0002], ease=[0.1709, 0.0004],
                 als=[0.1693, 0.0003], knn=[0.1720, 0.0003])
    skip = standing.out_of_reach(warm, 1020, higher=True)
    # ALS trails the blend by 0.0031 = 10 standard errors; the item-kNN by 0.0004 (1.3);
    # EASE is in the blend's pair, the model and the blend are never skipped
    assert set(skip) == {"als"}
    assert "trailed blend by 0.0031" in skip["als"] and "10 standard errors" in skip["als"]


def test_lower_is_better_metrics_turn_the_lead_around():
    warm = _warm(pair="model,knn", model=[0.5, 0.01], als=[0.9, 0.01], knn=[0.45, 0.01])
    assert set(standing.out_of_reach(warm, 1000, higher=False)) == {"als"}
    assert standing.out_of_reach(warm, 1000, higher=True) == {}   # then ALS leads


def test_every_challenger_is_refitted_once_the_rows_grow_past_the_reuse_rule():
    warm = _warm(model=[0.2, 0.001], als=[0.1, 0.001])
    assert set(standing.out_of_reach(warm, int(REUSE_GROWTH * 1000), higher=True)) == {"als"}
    assert standing.out_of_reach(warm, int(REUSE_GROWTH * 1000) + 1, higher=True) == {}
    assert standing.out_of_reach({}, 10, higher=True) == {}
    assert standing.out_of_reach(None, 10, higher=True) == {}


def test_record_keeps_a_skipped_challengers_last_standing_and_the_comparisons_rows():
    warm = _warm(model=[0.2, 0.001], als=[0.1, 0.001])
    state = {}
    standing.record(state, warm, {"model": 0.21, "blend": 0.22}, {"model": 0.002, "blend": 0.0},
                    {"als": "skipped"}, 1100)
    assert state[standing.STANDING + "model"].tolist() == [0.21, 0.002]
    assert state[standing.STANDING + "als"].tolist() == [0.1, 0.001]    # carried
    assert float(state[standing.ROWS]) == 1000.0      # the rows of the last full comparison
    fresh = {}
    standing.record(fresh, warm, {"model": 0.21, "als": 0.1}, {"model": 0.0, "als": 0.01},
                    {}, 1100)
    assert float(fresh[standing.ROWS]) == 1100.0      # this run compared every one
    none = {}
    standing.record(none, warm, {}, {}, {}, 1100)     # no per-user metric: no standing
    assert none == {}


def test_a_blend_out_of_reach_does_not_keep_its_members():
    # amazon-beauty: the item-kNN served, the model + ALS blend far behind it: ALS is judged
    # on its own standing, not kept for a blend that cannot serve
    warm = _warm(pair="model,als", model=[0.019, 0.0005], knn=[0.0357, 0.0006],
                 als=[0.0300, 0.0005], blend=[0.0310, 0.0004])
    assert set(standing.out_of_reach(warm, 1000, higher=True)) == {"als"}
    near = _warm(pair="model,als", model=[0.019, 0.0005], knn=[0.0357, 0.0006],
                 als=[0.0300, 0.0005], blend=[0.0355, 0.0004])
    assert standing.out_of_reach(near, 1000, higher=True) == {}


def test_the_dataset_makes_the_last_tunings_comparisons_only_where_the_config_tunes():
    """A warm run's dataset step makes its comparisons with the last tuning's comparison axes
    (the fit then reuses them, not makes them twice); a config that fixes λ fits the dataset's
    comparisons as they are, so those follow its own parameters, whatever the checkpoint says."""
    from pipeline.training.config import parse_model
    from pipeline.training.trainers import altsvm_tuning

    def cfg(**params):
        return parse_model("movies", {"algorithm": "altsvm", "kinds": ["interaction"],
                                      "params": {"implicit_sampling": "popularity", **params},
                                      "tune": {"max_settings": 6}}, "test")

    tuned = cfg()
    previous = {"warm_tuned_implicit_sampling": np.array("uniform"),
                "warm_tuned_implicit_per_user": np.array(500), "warm_tuned_rank": np.array(10),
                "warm_tuned_loss": np.array("hinge"), "warm_path_n": np.array(1000.0),
                "warm_reg_ratio": np.array(0.1), "warm_reg_per_comparison": np.array(0.01),
                "warm_U": np.zeros((3, 10))}
    axes = altsvm_tuning.dataset_axes(tuned, tuned.family, previous)
    assert axes == {"implicit_sampling": "uniform", "implicit_per_user": 500}
    own = {"implicit_sampling": "popularity",
           "implicit_per_user": tuned.family.dataset_param(tuned.params, "implicit_per_user")}
    assert altsvm_tuning.dataset_axes(tuned, tuned.family, None) == own
    fixed = cfg(reg=1.0)
    assert altsvm_tuning.dataset_axes(fixed, fixed.family, previous) == own
    made = {f"made_{a}": np.array(v) for a, v in axes.items()}
    assert altsvm_tuning.made_with(made, tuned.family, tuned.params) == axes
    assert altsvm_tuning.made_with({}, tuned.family, tuned.params) == own
