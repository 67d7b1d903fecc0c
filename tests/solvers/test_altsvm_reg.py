"""AltSVM's reg_max (the exact λ above which the factors are zero), reg as a fraction of it,
the collapse warnings, and the warm-started regularization path."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

from solvers import AltSVM, CollapseWarning
from solvers import _altsvm_solver as S

LOSSES = ["squared_hinge", "hinge", "logistic"]
SLOPE_AT_ZERO = {"squared_hinge": 2.0, "hinge": 1.0, "logistic": 0.5}


def planted(seed=1, n_users=40, n_items=30, rank=3, per_user=25):
    """Comparisons from a noisy rank-3 score matrix with a strong item popularity."""
    rng = np.random.default_rng(seed)
    X = (rng.normal(size=(n_users, rank)) @ rng.normal(size=(n_items, rank)).T
         + rng.normal(size=(n_users, n_items)) + 2 * rng.normal(size=n_items))
    rows = []
    for u in range(n_users):
        for _ in range(per_user):
            j, k = rng.choice(n_items, 2, replace=False)
            rows.append((u, j, k) if X[u, j] > X[u, k] else (u, k, j))
    return np.array(rows)


def quiet_fit(c, **params):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return AltSVM(**{"n_threads": 1, "random_state": 0, **params}).fit(c)


@pytest.mark.parametrize("loss", LOSSES)
def test_reg_max_is_the_top_singular_value_of_the_slope_matrix(loss):
    c = planted()
    G = np.zeros((40, 30))
    np.add.at(G, (c[:, 0], c[:, 1]), 1.0)
    np.add.at(G, (c[:, 0], c[:, 2]), -1.0)
    brute = SLOPE_AT_ZERO[loss] * np.linalg.svd(G, compute_uv=False)[0]
    assert AltSVM(loss=loss).reg_max(c) == pytest.approx(brute, rel=1e-6)


@pytest.mark.parametrize("item_bias", [False, True])
@pytest.mark.parametrize("loss", LOSSES)
def test_a_fit_just_above_reg_max_ends_at_zero_and_just_below_does_not(loss, item_bias):
    c = planted()
    reg_max = AltSVM(loss=loss, item_bias=item_bias).reg_max(c)
    params = {"rank": 3, "loss": loss, "item_bias": item_bias, "max_iter": 400, "tol": 0}
    with pytest.warns(CollapseWarning, match=r"is at or above reg_max = [\d.]+"):
        above = AltSVM(reg=1.02 * reg_max, n_threads=1, random_state=0, **params).fit(c)
    assert above.collapsed_
    assert np.abs(above.user_factors_ @ above.item_factors_.T).max() < 1e-8
    below = quiet_fit(c, reg=0.9 * reg_max, **params)
    assert not below.collapsed_
    assert np.abs(below.user_factors_ @ below.item_factors_.T).max() > 0.05
    assert below.reg_max_ == pytest.approx(reg_max, rel=5e-3)  # bias: a fixed point, to 1e-3
    # a short fit above reg_max (factors small, not yet at round-off) warns too
    with pytest.warns(CollapseWarning, match=r"is at or above reg_max .*on their way"):
        short = AltSVM(reg=1.05 * reg_max, n_threads=1, random_state=0, **params,
                       ).set_params(max_iter=20).fit(c)
    assert not short.collapsed_ and short.past_reg_max_
    assert not below.past_reg_max_


@pytest.mark.parametrize("item_bias", [False, True])
@pytest.mark.parametrize("loss", LOSSES)
def test_zero_is_optimal_at_one_lambda_agrees_with_reg_max(loss, item_bias):
    # the one-σ_max test a fit with small factors runs, against the secant's threshold
    c = planted()
    reg_max = AltSVM(loss=loss, item_bias=item_bias).reg_max(c)
    threshold = S.Threshold(c, 40, 30, loss)
    assert not threshold.zero_is_optimal(0.97 * reg_max, item_bias)
    assert threshold.zero_is_optimal(1.03 * reg_max, item_bias)


@pytest.mark.parametrize("loss", LOSSES)
def test_with_an_item_bias_reg_max_is_the_fixed_point_at_the_bias_optimum(loss):
    c = planted()
    reg_max = AltSVM(loss=loss, item_bias=True).reg_max(c)
    bias_only = quiet_fit(c, rank=0, item_bias=True, reg=reg_max, loss=loss, tol=1e-9,
                          max_iter=2000)
    state, b = bias_only.warm_state(), bias_only.item_bias_
    threshold = S.Threshold(c, 40, 30, loss)
    # the fit's duals are slopes at its optimum; the hinge's dual optimum need not be unique
    # (margins at the kink), so there σ_max depends on the one a fit reaches
    assert threshold.sigma(state["beta"]) == pytest.approx(
        reg_max, rel=3e-2 if loss == "hinge" else 1e-2)
    if loss != "hinge":   # and, for a smooth loss, the slopes of its bias
        z = b[state["winner"]] - b[state["loser"]]
        assert threshold.sigma(-S.loss_slope(loss, z)) == pytest.approx(reg_max, rel=1e-2)
    assert reg_max < AltSVM(loss=loss).reg_max(c)   # the bias explains the popular part


def test_reg_ratio_sets_reg_relative_to_reg_max_and_warns_at_one_or_more():
    c = planted()
    m = quiet_fit(c, rank=3, reg_ratio=0.25)
    assert m.reg_ == pytest.approx(0.25 * m.reg_max_) and m.reg is None
    with pytest.warns(CollapseWarning, match="reg_ratio is 1.5"):
        AltSVM(rank=3, reg_ratio=1.5, n_threads=1, random_state=0).fit(c)
    with pytest.raises(ValueError, match="reg_ratio is -1"):
        AltSVM(reg_ratio=-1).fit(c)


@pytest.mark.parametrize("loss", ["squared_hinge", "logistic", "hinge"])
def test_a_warm_start_starts_reg_max_at_the_last_one_and_finds_the_same_threshold(
        loss, monkeypatch):
    c = planted(seed=3, per_user=30)
    more = np.vstack([c, planted(seed=3, per_user=33)[-120:]])   # the same users, 10% more
    first = quiet_fit(c, rank=3, reg_ratio=0.5, item_bias=True, loss=loss)
    state = first.warm_state()
    assert float(state["known_reg_max"]) == first.reg_max_
    assert state["sigma_vector"].shape == (30,)      # ARPACK's side: the items, the shorter
    sigmas = []
    real_sigma = S.Threshold.sigma
    monkeypatch.setattr(S.Threshold, "sigma",
                        lambda self, slopes: sigmas.append(1) or real_sigma(self, slopes))
    cold = AltSVM(loss=loss, item_bias=True).reg_max(more)
    n_cold, sigmas[:] = len(sigmas), []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        warm = AltSVM(rank=3, reg_ratio=0.5, item_bias=True, loss=loss, n_threads=1,
                      random_state=0).fit(more, warm_start=state)
    assert warm.reg_max_ == pytest.approx(cold, rel=S.SECANT_TOL)
    assert warm.reg_ == pytest.approx(0.5 * warm.reg_max_)
    assert len(sigmas) < n_cold
    assert float(warm.warm_state()["known_reg_max"]) == warm.reg_max_


def test_a_warm_state_whose_known_reg_max_is_not_a_finite_scalar_is_refused():
    c = planted()
    state = quiet_fit(c, rank=3, reg_ratio=0.5).warm_state()
    for bad, said in ((np.array([1.0, 2.0]), "has shape"), (np.array(np.nan), "nan")):
        with pytest.raises(ValueError, match=f"known_reg_max.*{said}"):
            AltSVM(rank=3, reg_ratio=0.5).fit(c, warm_start={**state, "known_reg_max": bad})


def test_the_path_warm_starts_to_the_cold_solutions_and_keeps_the_best_point():
    c = planted(seed=2, per_user=40)
    held = planted(seed=2, per_user=60)[-600:]   # same planted X, other comparisons

    def accuracy(model):
        s = model.predict(held[:, 0], held[:, 1]) - model.predict(held[:, 0], held[:, 2])
        return float((s > 0).mean())

    model = AltSVM(rank=3, item_bias=True, n_threads=1, random_state=0, tol=1e-5,
                   max_iter=200)
    model.fit_path(c, score=accuracy, ratios=np.geomspace(0.8, 0.02, 6), patience=10)
    assert len(model.path_) == 6
    assert [p["n_iter"] for p in model.path_[1:]] < [200] * 5
    for point in model.path_:
        cold = quiet_fit(c, rank=3, item_bias=True, reg=point["reg"], tol=1e-5, max_iter=200)
        assert accuracy(cold) == pytest.approx(point["score"], abs=0.02)
    best = max(model.path_, key=lambda p: p["score"])
    assert model.reg == model.reg_ == best["reg"] and accuracy(model) == best["score"]
    assert not model.collapsed_


def test_the_path_stops_after_patience_points_without_improvement():
    c = planted()
    scores = iter([0.5, 0.7, 0.6, 0.65, 0.9])
    model = AltSVM(rank=2, n_threads=1, random_state=0).fit_path(
        c, score=lambda m: next(scores), ratios=[0.8, 0.4, 0.2, 0.1, 0.05], patience=2)
    assert [p["score"] for p in model.path_] == [0.5, 0.7, 0.6, 0.65]
    assert model.reg == model.path_[1]["reg"]


def test_a_model_whose_duals_were_dropped_scores_the_same_and_refuses_to_warm_start():
    c = planted()
    m = quiet_fit(c, rank=3, reg=5.0)
    users, items = c[:, 0], c[:, 1]
    scores, lists = m.predict(users, items), m.recommend(np.arange(40), k=5)
    assert m.drop_duals() is m
    assert np.array_equal(m.predict(users, items), scores)
    assert all(np.array_equal(a, b) for a, b in zip(m.recommend(np.arange(40), k=5), lists))
    for use in (m.warm_state, lambda: m.reg_max_):
        with pytest.raises(ValueError, match=r"dropped \(drop_duals\)"):
            use()


def test_a_fit_from_the_warm_view_is_the_fit_from_the_warm_state_and_leaves_its_source():
    # the refit's warm start: the evaluated model's own arrays, read, never copied or changed
    c = planted()
    m = quiet_fit(c, rank=3, reg=5.0, max_iter=5)
    before = {k: np.array(v, copy=True) for k, v in m.warm_state().items()}
    view = m.warm_view()
    assert np.shares_memory(view["alpha"], m.warm_view()["alpha"])
    assert view["user"].dtype == m._comparisons.dtype
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        a, b = (AltSVM(rank=3, reg=6.0, max_iter=3, n_threads=1, random_state=0).fit(
            c, warm_start=start) for start in (m.warm_state(), view))
    assert np.array_equal(a.user_factors_, b.user_factors_)
    assert np.array_equal(a.item_factors_, b.item_factors_)
    for k, v in m.warm_state().items():
        assert np.array_equal(v, before[k]), k
