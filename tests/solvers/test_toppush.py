"""TopPush estimator: optimality (duality gap, gradient), the stopping guarantee against a tight
reference, warm start, dtypes and storage, persistence, input validation, degenerate fits (never
worse than w = 0, advice that holds), and real-data checks on the authors' spambase split."""

from __future__ import annotations

import doctest
import re
import warnings

import numpy as np
import pytest
import scipy.sparse as sp

import solvers._toppush_solver as toppush_solver
import solvers.toppush as toppush_module
from solvers import ConvergenceWarning, DegenerateFitWarning, NotFittedError, TopPush
from solvers import _toppush_kernels as K
from solvers._bipartite_metrics import auc, average_precision, pos_at_top
from solvers._toppush_solver import LOSS_AT_ZERO

LOSSES = ["truncated_quadratic", "logistic", "exponential"]


def make_data(m=60, n=240, d=8, seed=0, shift=3.0):
    """Positives shifted along two directions; rows shuffled; ‖x‖ around 1."""
    rng = np.random.default_rng(seed)
    Xp = rng.normal(size=(m, d))
    Xp[:, 0] += shift
    Xp[:, 1] += shift / 2
    Xn = rng.normal(size=(n, d))
    X = np.vstack([Xp, Xn]) / np.sqrt(d)
    y = np.r_[np.ones(m, int), np.zeros(n, int)]
    perm = rng.permutation(m + n)
    return X[perm], y[perm]


def primal_objective(X, y, w, reg, loss):
    """Eq. 6 evaluated directly."""
    s = X @ w
    z = s[y == 0].max() - s[y == 1]
    ell = {"truncated_quadratic": np.maximum(1.0 + z, 0.0) ** 2,
           "logistic": np.logaddexp(0.0, z),
           "exponential": np.exp(z)}[loss]
    return reg / 2 * w @ w + ell.mean()


# --------------------------------------------------------------------------------------------
# optimality
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("loss", LOSSES)
@pytest.mark.parametrize("reg", [0.1, 1.0])
def test_duality_gap_closes_at_convergence(loss, reg):
    X, y = make_data()
    model = TopPush(loss=loss, reg=reg, tol=1e-10, max_iter=20000).fit(X, y)
    primal = primal_objective(X, y, model.coef_, reg, loss)
    dual = -model.dual_objective_ / y.sum()  # max of the dual = −min g / m
    assert primal >= dual - 1e-9
    assert (primal - dual) / abs(primal) < 1e-4, (primal, dual)
    # w is eq. 9 of the returned duals
    Xp, Xn = X[y == 1], X[y == 0]
    w = (model.dual_alpha_ @ Xp - model.dual_beta_ @ Xn) / (reg * y.sum())
    np.testing.assert_allclose(model.coef_, w, rtol=1e-10, atol=1e-10)
    # the duals are feasible
    assert model.dual_alpha_.min() >= 0 and model.dual_beta_.min() >= 0
    np.testing.assert_allclose(model.dual_alpha_.sum(), model.dual_beta_.sum(), rtol=1e-10)


def test_default_tolerance_is_close_to_the_optimum():
    X, y = make_data(seed=1)
    loose = TopPush().fit(X, y)
    tight = TopPush(tol=1e-10, max_iter=20000).fit(X, y)
    assert loose.n_iter_ < tight.n_iter_
    p_loose = primal_objective(X, y, loose.coef_, loose.reg, loose.loss)
    p_opt = primal_objective(X, y, tight.coef_, tight.reg, tight.loss)
    assert p_opt <= p_loose <= p_opt + loose.tol * p_loose    # what the gap rule guarantees


# --------------------------------------------------------------------------------------------
# the stopping guarantee: P(coef_) − min P ≤ tol·P(coef_), against a tight reference
# --------------------------------------------------------------------------------------------


def tight_optimum(X, y, reg, loss):
    """min P of eq. 6 from a fit to a relative duality gap of 1e-10 (certified by the gap)."""
    tight = TopPush(loss=loss, reg=reg, tol=1e-10, max_iter=50000).fit(X, y)
    assert tight.converged_
    return primal_objective(X, y, tight.coef_, reg, loss)


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("reg", [0.1, 1.0])
@pytest.mark.parametrize("loss", LOSSES)
def test_default_fit_is_within_tol_of_the_optimum(loss, reg, seed):
    """The default stops with P(coef_) ≤ (1 + tol)·min P, tol = 2 %, with neither a
    convergence nor a degenerate-fit warning, on problems where w = 0 is far (> 5 %) from the
    optimum (so that the guarantee says something about the ranking)."""
    X, y = make_data(seed=seed, shift=4.0)
    p_opt = tight_optimum(X, y, reg, loss)
    assert LOSS_AT_ZERO[loss] > 1.05 * p_opt  # not degenerate
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        fit = TopPush(loss=loss, reg=reg).fit(X, y)
    assert fit.tol == 2e-2 and fit.converged_
    p = primal_objective(X, y, fit.coef_, reg, loss)
    assert p_opt <= p * (1 + 1e-12)
    assert p <= (1 + fit.tol) * p_opt, (p / p_opt - 1, fit.n_iter_)
    lower = -fit.dual_objective_ / y.sum()
    assert lower <= p_opt * (1 + 1e-12) and p - lower <= fit.tol * lower  # the certificate


@pytest.mark.parametrize("tol", [5e-2, 2e-2, 1e-2, 1e-3])
@pytest.mark.parametrize("sparse", [False, True])
def test_suboptimality_is_at_most_tol(tol, sparse):
    for seed in (3, 4):
        X, y = make_data(m=80, n=400, seed=seed, shift=4.0)
        p_opt = tight_optimum(X, y, 0.5, "truncated_quadratic")
        fit = TopPush(reg=0.5, tol=tol).fit(sp.csr_matrix(X) if sparse else X, y)
        p = primal_objective(X, y, fit.coef_, 0.5, "truncated_quadratic")
        assert p <= (1 + tol) * p_opt, (tol, p / p_opt - 1)


def test_tight_optimum_agrees_with_the_authors_algorithm():
    """The slow reference: the numpy port of the authors' topPush.m, run until its step is
    exactly zero, brackets TopPush's certified optimum: its dual value −g/m from below (to
    1e-8) and its P(w) from above (to 1e-5; the primal of eq. 9 converges more slowly)."""
    from bench._toppush_reference import primal_objective as authors_primal
    from bench._toppush_reference import toppush_authors

    X, y = make_data(m=30, n=120, d=6, seed=7, shift=4.0)
    p_opt = tight_optimum(X, y, 1.0, "truncated_quadratic")
    w, info = toppush_authors(X, y, lam=1.0, tol=0.0, delta=0.0, max_iter=5000)
    p_auth = authors_primal(X, y, w)
    assert p_opt * (1 - 1e-9) <= p_auth <= p_opt * (1 + 1e-5), info["stop"]
    assert -info["dual_objective"] / y.sum() == pytest.approx(p_opt, rel=1e-8)
    fit = TopPush(reg=1.0).fit(X, y)
    assert authors_primal(X, y, fit.coef_) <= (1 + fit.tol) * p_opt


def test_warm_start_from_a_stale_point_still_meets_the_guarantee():
    """A warm start cannot fool the rule: from the duals of a 2-iteration fit on other data
    (same ids) the refit still ends within tol of the optimum."""
    X, y = make_data(seed=8, shift=4.0)
    X_other, _ = make_data(seed=9, shift=1.0)
    ids = np.arange(X.shape[0])
    with warnings.catch_warnings():
        # the other data is degenerate (its positives' mean is in the negatives' hull): the
        # 2-iteration fit returns w = 0 with the hull's dual point, a stale start for X
        warnings.simplefilter("ignore", DegenerateFitWarning)
        warnings.simplefilter("ignore", ConvergenceWarning)
        stale = TopPush(max_iter=2).fit(X_other, y, ids=ids)
    p_opt = tight_optimum(X, y, 1.0, "truncated_quadratic")
    warm = TopPush().fit(X, y, ids=ids, warm_start=stale.warm_state())
    p = primal_objective(X, y, warm.coef_, 1.0, "truncated_quadratic")
    assert warm.converged_ and p <= (1 + warm.tol) * p_opt


@pytest.mark.parametrize("loss", [K.TRUNCATED_QUADRATIC, K.LOGISTIC, K.EXPONENTIAL])
def test_primal_objective_kernel_matches_numpy(loss):
    rng = np.random.default_rng(3)
    m, reg = 9, 0.3
    z = rng.normal(scale=4.0, size=40)
    nu = rng.normal(size=5)
    name = LOSSES[loss]
    t = (z[m:].max() - z[:m]) / (reg * m)
    ell = {"truncated_quadratic": np.maximum(1 + t, 0) ** 2, "logistic": np.logaddexp(0, t),
           "exponential": np.exp(t)}[name]
    expected = nu @ nu / (2 * reg * m * m) + ell.mean()
    assert K.primal_objective(z, nu, m, reg, loss) == pytest.approx(expected, rel=1e-12)
    # the maximum is over the negatives present: a shorter z is a working set
    t = (z[m:20].max() - z[:m]) / (reg * m)
    assert K.primal_objective(z[:20], nu, m, reg, K.TRUNCATED_QUADRATIC) == pytest.approx(
        nu @ nu / (2 * reg * m * m) + np.mean(np.maximum(1 + t, 0) ** 2), rel=1e-12)
    assert K.loss_value(800.0, K.LOGISTIC) == pytest.approx(800.0)  # no overflow


@pytest.mark.parametrize("loss", [K.TRUNCATED_QUADRATIC, K.LOGISTIC, K.EXPONENTIAL])
def test_gradient_of_dual_matches_finite_differences(loss):
    rng = np.random.default_rng(2)
    X, y = make_data(m=7, n=11, d=5)
    X = np.vstack([X[y == 1], X[y == 0]])  # positives first, as the kernels expect
    m, reg = 7, 0.7
    gam = rng.uniform(0.05, 0.9, size=X.shape[0])

    def g(v):
        nu = np.zeros(X.shape[1])
        K.signed_combination(False, np.zeros(1, np.int32), np.zeros(0, np.uint32),
                             np.zeros(0), X, m, v, nu)
        return K.dual_objective(nu, v, m, reg, loss)

    nu = X[:m].T @ gam[:m] - X[m:].T @ gam[m:]
    grad = np.empty_like(gam)
    K.dual_gradient(X @ nu, gam, m, reg, loss, False, grad)
    h = 1e-6
    fd = np.array([(g(gam + h * e) - g(gam - h * e)) / (2 * h) for e in np.eye(gam.size)])
    np.testing.assert_allclose(grad, fd, rtol=1e-6, atol=1e-7)


# --------------------------------------------------------------------------------------------
# warm start
# --------------------------------------------------------------------------------------------


def test_warm_start_from_optimum_stops_at_once():
    X, y = make_data(seed=3)
    ids = np.arange(1000, 1000 + X.shape[0])
    cold = TopPush(tol=1e-10, max_iter=20000, random_state=0).fit(X, y, ids=ids)
    warm = TopPush(random_state=0).fit(X, y, ids=ids, warm_start=cold.warm_state())
    assert warm.n_iter_ <= 2
    np.testing.assert_allclose(warm.coef_, cold.coef_, rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize("tol", [1e-4, 1e-8])
def test_warm_start_after_adding_instances_is_faster_and_reaches_the_same_optimum(tol):
    X, y = make_data(m=300, n=1200, seed=4)
    ids = np.array([f"item-{i}" for i in range(X.shape[0])])
    n_old = int(X.shape[0] / 1.05)  # the refit sees 5 % new instances
    old = TopPush(tol=tol, random_state=0).fit(X[:n_old], y[:n_old], ids=ids[:n_old])
    # rows reordered as well: the duals must follow the ids, not the positions
    perm = np.random.default_rng(0).permutation(X.shape[0])
    X, y, ids = X[perm], y[perm], ids[perm]
    cold = TopPush(tol=tol, random_state=0).fit(X, y, ids=ids)
    warm = TopPush(tol=tol, random_state=0).fit(X, y, ids=ids, warm_start=old.warm_state())
    assert warm.n_iter_ < cold.n_iter_, (warm.n_iter_, cold.n_iter_)
    # the stopping rule is a relative duality gap: both runs end within tol of the optimum
    assert abs(warm.dual_objective_ - cold.dual_objective_) < tol * abs(cold.dual_objective_)


@pytest.mark.parametrize("tol", [1e-2, 1e-3])
@pytest.mark.parametrize("added", [0.02, 0.05])
def test_warm_start_after_adding_instances_stops_as_close_to_the_optimum_as_cold(tol, added):
    """The stopping rule must not favour the warm start (which begins near the optimum and makes
    little progress per iteration): the warm fit's primal objective (6) must be as good as the
    cold fit's, to within the tolerance, and each must satisfy the duality-gap rule."""
    X, y = make_data(m=300, n=1500, seed=13, shift=4.0)   # w = 0 is far from optimal
    n_old = int(X.shape[0] / (1.0 + added))
    ids = np.arange(X.shape[0])
    old = TopPush(tol=tol, random_state=0).fit(X[:n_old], y[:n_old], ids=ids[:n_old])
    cold = TopPush(tol=tol, random_state=0).fit(X, y, ids=ids)
    warm = TopPush(tol=tol, random_state=0).fit(X, y, ids=ids, warm_start=old.warm_state())
    assert warm.converged_ and cold.converged_
    assert warm.n_iter_ < cold.n_iter_, (warm.n_iter_, cold.n_iter_)
    m = y.sum()
    p_cold = primal_objective(X, y, cold.coef_, 1.0, "truncated_quadratic")
    p_warm = primal_objective(X, y, warm.coef_, 1.0, "truncated_quadratic")
    for p, fit in ((p_cold, cold), (p_warm, warm)):
        assert p + fit.dual_objective_ / m <= tol * p  # the rule, checked from outside
    assert abs(p_warm - p_cold) <= tol * p_cold, (p_warm, p_cold)


def test_warm_start_maps_duals_by_id_and_projects():
    X, y = make_data(seed=5)
    ids = np.arange(X.shape[0]) * 10
    model = TopPush(tol=1e-10).fit(X, y, ids=ids)
    state = model.warm_state()
    assert set(state) >= {"pos_ids", "alpha", "neg_ids", "beta", "coef"}
    assert all(isinstance(v, np.ndarray) for v in state.values())
    # drop one positive with a positive α: the mapped start is infeasible until projected
    drop = state["pos_ids"][np.argmax(state["alpha"])]
    keep = ids != drop
    refit = TopPush(tol=1e-10, max_iter=1).fit
    with pytest.warns(ConvergenceWarning):
        one_step = refit(X[keep], y[keep], ids=ids[keep], warm_start=state)
    assert one_step.dual_alpha_.min() >= 0 and one_step.dual_beta_.min() >= 0
    np.testing.assert_allclose(one_step.dual_alpha_.sum(), one_step.dual_beta_.sum(),
                               rtol=1e-10)


def test_warm_start_rejects_mismatched_id_types():
    X, y = make_data(seed=6)
    model = TopPush().fit(X, y, ids=np.arange(X.shape[0]))
    with pytest.raises(ValueError, match="dtype"):
        TopPush().fit(X, y, ids=np.array([f"x{i}" for i in range(X.shape[0])]),
                      warm_start=model.warm_state())


# --------------------------------------------------------------------------------------------
# dtypes, storage, labels, determinism
# --------------------------------------------------------------------------------------------


def test_dense_and_csr_agree():
    """Same optimum from every storage. Paths differ by round-off only, but the last digits of
    w are not determined by the stopping rule (the dual is flat near its optimum), so w is
    compared to 1e-3 and the objective to 1e-8."""
    X, y = make_data(seed=7)
    X[np.abs(X) < 0.3] = 0.0
    fits = [TopPush(tol=1e-10, max_iter=20000, random_state=0).fit(A, y)
            for A in (X, sp.csr_matrix(X), sp.csc_matrix(X))]
    for other in fits[1:]:
        np.testing.assert_allclose(other.coef_, fits[0].coef_, rtol=1e-3, atol=1e-4)
        assert other.dual_objective_ == pytest.approx(fits[0].dual_objective_, rel=1e-8)
    np.testing.assert_allclose(fits[2].decision_function(sp.csr_matrix(X)),
                               fits[0].decision_function(X), rtol=1e-3, atol=1e-4)


@pytest.mark.parametrize("sparse", [False, True])
def test_float32_and_float64_agree(sparse):
    X, y = make_data(seed=8)
    X32 = X.astype(np.float32)
    if sparse:
        X, X32 = sp.csr_matrix(X), sp.csr_matrix(X32)
    m64 = TopPush(tol=1e-10, max_iter=20000, random_state=0).fit(X, y)
    m32 = TopPush(tol=1e-10, max_iter=20000, random_state=0).fit(X32, y)
    assert m64.coef_.dtype == np.float64 and m32.coef_.dtype == np.float32
    np.testing.assert_allclose(m32.coef_, m64.coef_, rtol=1e-3, atol=1e-4)
    assert m32.dual_objective_ == pytest.approx(m64.dual_objective_, rel=1e-6)


def test_labels_01_and_pm1_agree_and_result_ignores_random_state():
    X, y = make_data(seed=9)
    a = TopPush(random_state=0).fit(X, y)
    b = TopPush(random_state=123).fit(X, np.where(y == 1, 1, -1))
    np.testing.assert_allclose(a.coef_, b.coef_, rtol=1e-10, atol=1e-14)
    assert a.n_iter_ == b.n_iter_


def test_fit_intercept_puts_the_top_training_negative_at_zero():
    X, y = make_data(seed=10)
    plain = TopPush().fit(X, y)
    shifted = TopPush(fit_intercept=True).fit(X, y)
    assert plain.intercept_ == 0.0
    np.testing.assert_allclose(shifted.coef_, plain.coef_)
    scores = shifted.decision_function(X)
    assert scores[y == 0].max() == pytest.approx(0.0, abs=1e-12)
    assert np.mean(scores[y == 1] > 0) == pytest.approx(pos_at_top(y, scores))


def test_convergence_warning_says_what_to_change():
    X, y = make_data(seed=11)
    with pytest.warns(ConvergenceWarning, match=r"max_iter=3.*increase max_iter"):
        model = TopPush(max_iter=3).fit(X, y)
    assert model.n_iter_ == 3 and not model.converged_


# --------------------------------------------------------------------------------------------
# persistence
# --------------------------------------------------------------------------------------------


def test_save_load_roundtrip(tmp_path):
    X, y = make_data(seed=12)
    ids = np.array([f"doc{i}" for i in range(X.shape[0])])
    model = TopPush(reg=0.5, loss="logistic", fit_intercept=True, random_state=3).fit(
        X, y, ids=ids)
    model.save(tmp_path / "tp")
    loaded = TopPush.load(tmp_path / "tp")
    assert loaded.get_params() == model.get_params()
    np.testing.assert_array_equal(loaded.decision_function(X), model.decision_function(X))
    for key, value in model.warm_state().items():
        np.testing.assert_array_equal(loaded.warm_state()[key], value)
    assert loaded.n_iter_ == model.n_iter_ and loaded.intercept_ == model.intercept_
    # the loaded state warm-starts a refit that stops at once
    refit = TopPush(reg=0.5, loss="logistic").fit(X, y, ids=ids,
                                                   warm_start=loaded.warm_state())
    assert refit.n_iter_ <= 2
    with pytest.raises(ValueError, match="holds a 'TopPush' model, expected 'AltSVM'"):
        from solvers import AltSVM
        AltSVM.load(tmp_path / "tp")


# --------------------------------------------------------------------------------------------
# input validation: every message names the problem and the values
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("X_mod, y_mod, match", [
    (None, lambda y: np.ones_like(y), r"only one class.*all 300 labels are positive"),
    (None, lambda y: np.zeros_like(y), r"only one class.*negative \(0\)"),
    (None, lambda y: np.where(y == 1, 2, 0), r"labels \[2\]"),
    (None, lambda y: np.where(y == 1, 1, 3), r"labels \[3\]"),
    (None, lambda y: y[:-1], r"X has 300 rows but y has 299 labels"),
    (None, lambda y: np.where(y == 1, 1.0, np.nan), r"labels \[nan\]"),
    (lambda X: np.where(np.arange(X.size).reshape(X.shape) == 17, np.nan, X), None,
     r"X contains .*nan.* at position \(2, 1\)"),
    (lambda X: np.where(np.arange(X.size).reshape(X.shape) == 9, np.inf, X), None,
     r"X contains .*inf.* at position \(1, 1\)"),
    (lambda X: sp.csr_matrix(np.where(np.arange(X.size).reshape(X.shape) == 9, np.inf, X)),
     None, r"X contains .*inf.* at position \(1, 1\)"),
    (lambda X: X[:, :, None], None, r"X has 3 dimensions"),
])
def test_bad_input_raises_value_error_naming_it(X_mod, y_mod, match):
    X, y = make_data()
    X = X_mod(X) if X_mod else X
    y = y_mod(y) if y_mod else y
    with pytest.raises(ValueError, match=match):
        TopPush().fit(X, y)


@pytest.mark.parametrize("params, match", [
    ({"reg": 0.0}, r"reg is 0.0, expected a finite number > 0"),
    ({"reg": -1}, r"reg is -1"),
    ({"loss": "hinge"}, r"loss is 'hinge', expected one of"),
    ({"tol": -1e-3}, r"tol is -0.001"),
    ({"max_iter": 0}, r"max_iter is 0, expected an integer >= 1"),
])
def test_bad_parameters_raise(params, match):
    X, y = make_data()
    with pytest.raises(ValueError, match=match):
        TopPush(**params).fit(X, y)


def test_bad_ids_and_prediction_inputs():
    X, y = make_data()
    with pytest.raises(ValueError, match=r"ids are not unique: \[5\]"):
        TopPush().fit(X, y, ids=np.r_[np.arange(299), 5])
    with pytest.raises(ValueError, match=r"ids has shape \(10,\), expected \(300,\)"):
        TopPush().fit(X, y, ids=np.arange(10))
    with pytest.raises(ValueError, match="warm_start lacks"):
        TopPush().fit(X, y, warm_start={"alpha": np.zeros(3)})
    model = TopPush().fit(X, y)
    with pytest.raises(ValueError, match="X has 7 features, the model was trained with 8"):
        model.decision_function(X[:, :7])
    with pytest.raises(NotFittedError, match="not fitted"):
        TopPush().decision_function(X)
    with pytest.raises(TypeError):
        TopPush(1.0)  # keyword-only


# --------------------------------------------------------------------------------------------
# documentation example and real data
# --------------------------------------------------------------------------------------------


def test_docstring_example_runs():
    result = doctest.testmod(toppush_module, verbose=False)
    assert result.attempted > 0 and result.failed == 0


def test_spambase_split_of_the_authors(shared_data):
    """The TopPush demo split (3,068 train / 1,533 test, [0, 1]-scaled). Paper, Table 2 (30
    random splits, λ by cross-validation): Pos@Top .129 ± .077, AP .922, NDCG .988, AUC .942.

    At λ = 1 eq. 6 is degenerate here (see below; its optimum has test AP .85); λ = 1e-4 is
    not, and its optimum within tol ranks as below. (Before the guard, the λ = 1 fit reached
    AP .917 with a coef_ whose P was 1.016 > P(0): a ranking set by where the iterations
    stopped, not by eq. 6.)"""
    from scipy.io import loadmat

    path = shared_data / "spambase" / "toppush_spambase_split.mat"
    if not path.exists():
        pytest.skip(f"{path} not found")
    d = loadmat(path)
    Xtr, Xte = d["Xtr"].tocsr(), d["Xte"].tocsr()
    ytr, yte = d["ytr"].ravel(), d["yte"].ravel()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        model = TopPush(reg=1e-4, random_state=0).fit(Xtr, ytr)
    assert model.coef_source_ == "dual" and model.objective_ < 0.95
    scores = model.decision_function(Xte)
    assert 0.02 <= pos_at_top(yte, scores) <= 0.4
    assert average_precision(yte, scores) >= 0.87
    assert auc(yte, scores) >= 0.91


@pytest.mark.parametrize("partial, expected_log", [
    (3, r"removed negatives became active or top: back to \d+ of 1000 negatives\n"),
    (0, r"removed negatives became active or top: back to 1000 of 1000 negatives, "
        r"shrinking off"),
])
def test_shrinking_reaches_the_optimum_of_the_full_problem(capsys, monkeypatch, partial,
                                                            expected_log):
    """Shrinking removes low-scored negatives from the working problem; when removed ones turn
    out to want β > 0 at the end, they come back (only those, the first UNSHRINK_PARTIAL times;
    then all of them, and shrinking stops). This data set takes that path."""
    X, y = make_data(m=100, n=1000, seed=2)
    monkeypatch.setattr(toppush_solver, "UNSHRINK_PARTIAL", partial)
    shrunk = TopPush(tol=1e-10, max_iter=20000, verbose=True, random_state=0).fit(X, y)
    log = capsys.readouterr().out
    assert "shrinking:" in log and re.search(expected_log, log), log[-2000:]
    monkeypatch.setattr(toppush_solver, "SHRINK", False)
    full = TopPush(tol=1e-10, max_iter=20000, random_state=0).fit(X, y)
    assert shrunk.dual_objective_ == pytest.approx(full.dual_objective_, rel=1e-7)
    np.testing.assert_allclose(shrunk.coef_, full.coef_, rtol=1e-3, atol=1e-4)
    # KKT: the negatives carrying β are the top-scored ones
    neg_scores = X[y == 0] @ shrunk.coef_
    carrying = shrunk.dual_beta_ > 1e-9 * shrunk.dual_beta_.max()
    spread = neg_scores.max() - neg_scores.min()
    assert neg_scores[carrying].min() >= neg_scores.max() - 1e-3 * spread


# --------------------------------------------------------------------------------------------
# equal negatives are solved once
# --------------------------------------------------------------------------------------------


def test_distinct_rows_matches_a_brute_force_grouping():
    rng = np.random.default_rng(4)
    base = sp.random(40, 12, density=0.3, random_state=5, format="csr")
    rows = rng.integers(0, 40, 200)
    X = sp.vstack([base[rows], sp.csr_matrix((3, 12))]).tocsr()  # repeats and empty rows
    X.sort_indices()
    X.data[7] += 1e-12  # a near-duplicate stays apart
    first, rep = toppush_solver.distinct_rows(X)
    seen, expected = {}, np.empty(X.shape[0], int)
    for i in range(X.shape[0]):
        row = X[i]
        expected[i] = seen.setdefault((row.indices.tobytes(), row.data.tobytes()), i)
    np.testing.assert_array_equal(rep, expected)
    np.testing.assert_array_equal(first, np.flatnonzero(expected == np.arange(X.shape[0])))
    dense_first, dense_rep = toppush_solver.distinct_rows(X.toarray())
    np.testing.assert_array_equal(dense_rep, expected)


def test_equal_negatives_give_the_same_fit_as_one_copy_each():
    """Eq. 6 sees the negatives only through their maximum: repeating some changes nothing.
    With CSR input the solver keeps one of each; the repeats get β = 0, and a warm start's β on
    a repeat is moved to the kept row."""
    X, y = make_data(seed=14, shift=4.0)
    neg = np.flatnonzero(y == 0)
    extra = neg[:60]
    Xd, yd = np.vstack([X, X[extra]]), np.r_[y, y[extra]]
    once = TopPush(tol=1e-9, max_iter=50000, random_state=0).fit(sp.csr_matrix(X), y)
    twice = TopPush(tol=1e-9, max_iter=50000, random_state=0).fit(sp.csr_matrix(Xd), yd)
    np.testing.assert_allclose(twice.coef_, once.coef_, rtol=1e-4, atol=1e-6)
    assert twice.dual_objective_ == pytest.approx(once.dual_objective_, rel=1e-8)
    assert np.all(twice.dual_beta_[-60:] == 0.0)  # the repeats come last among the negatives
    Xp, Xn = Xd[yd == 1], Xd[yd == 0]
    w = (twice.dual_alpha_ @ Xp - twice.dual_beta_ @ Xn) / yd.sum()
    np.testing.assert_allclose(twice.coef_, w, rtol=1e-10, atol=1e-12)
    # warm start with all of β on the repeats: merged into the kept rows, same optimum
    state = twice.warm_state()
    state["beta"] = np.r_[np.zeros(neg.size), np.ones(60)]
    warm = TopPush(tol=1e-9, max_iter=50000).fit(sp.csr_matrix(Xd), yd, warm_start=state)
    assert warm.dual_objective_ == pytest.approx(once.dual_objective_, rel=1e-8)
    assert warm.dual_alpha_.sum() == pytest.approx(warm.dual_beta_.sum(), rel=1e-10)


# --------------------------------------------------------------------------------------------
# empty and one-class input, zero columns, degenerate fits
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("X, y, match", [
    (np.zeros((0, 3)), np.zeros(0), r"X has 0 rows \(shape \(0, 3\)\) and y has 0 labels; "
                                    r"TopPush needs at least one positive and one negative"),
    (sp.csr_matrix((0, 3)), np.zeros(0), r"X has 0 rows \(shape \(0, 3\)\) and y has 0 labels"),
    (np.zeros((0, 0)), np.zeros(0), r"X has 0 rows \(shape \(0, 0\)\)"),
    (np.zeros((4, 0)), np.r_[1, 0, 0, 1], r"X has 0 features \(shape \(4, 0\)\), expected at "
                                           r"least 1"),
    (sp.csr_matrix((4, 0)), np.r_[1, 0, 0, 1], r"X has 0 features \(shape \(4, 0\)\)"),
    (np.ones((3, 2)), np.ones(3), r"only one class: all 3 labels are positive \(1\) "
                                  r"\(3 positives, 0 negatives\)"),
    (np.ones((3, 2)), -np.ones(3), r"only one class: all 3 labels are negative \(-1\) "
                                   r"\(0 positives, 3 negatives\)"),
])
def test_empty_and_one_class_input_raise_naming_both_values(X, y, match):
    with pytest.raises(ValueError, match=match):
        TopPush().fit(X, y)


@pytest.mark.parametrize("sparse", [False, True])
def test_all_zero_columns_are_silently_fine_and_get_weight_zero(sparse):
    """Decision (documented in ``fit``): zero columns are accepted without a warning; w is a
    combination of the rows (eq. 9), so their weight is exactly 0 and the rest is unchanged."""
    X, y = make_data(seed=6, shift=4.0)
    Xz = np.insert(X, [0, 3, 3], 0.0, axis=1)  # zero columns 0, 4 and 5
    zero = [0, 4, 5]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with_zeros = TopPush(tol=1e-8, random_state=0).fit(sp.csr_matrix(Xz) if sparse else Xz,
                                                           y)
    plain = TopPush(tol=1e-8, random_state=0).fit(X, y)
    assert np.all(with_zeros.coef_[zero] == 0.0)
    np.testing.assert_allclose(np.delete(with_zeros.coef_, zero), plain.coef_, rtol=1e-4,
                               atol=1e-6)


def test_all_zero_X_warns_that_the_scores_are_constant():
    X, y = np.zeros((20, 3)), np.r_[np.ones(5), np.zeros(15)]
    with pytest.warns(DegenerateFitWarning, match=r"degenerate: coef_ is all zero, so the model "
                      r"ranks every instance alike \(reg=1; data: max row norm 0, .*X is all "
                      r"zeros"):
        model = TopPush().fit(X, y)
    assert not model.coef_.any() and model.converged_


def test_identical_rows_warn_that_lowering_reg_cannot_help():
    X, y = np.tile([1.0, -2.0, 0.5], (12, 1)), np.r_[np.ones(4), np.zeros(8)]
    with pytest.warns(DegenerateFitWarning, match=r"(coef_ is all zero|the training scores are "
                      r"all equal), so the model ranks every instance alike \(reg=0.5; data: max "
                      r"row norm 2.29, ‖mean x⁺ − mean x⁻‖ = 0\).*means coincide.*cannot help"):
        TopPush(reg=0.5).fit(X, y)


def hull_data(seed=0):
    """Negatives on a ring around positives: the positives' mean lies in the convex hull of the
    negatives, so w = 0 minimizes eq. 6 at every reg (every w scores some negative at least as
    high as the positives' mean, and ℓ is non-decreasing)."""
    rng = np.random.default_rng(seed)
    angle = rng.uniform(0, 2 * np.pi, 200)
    Xn = 2.0 * np.c_[np.cos(angle), np.sin(angle)] + 0.1 * rng.normal(size=(200, 2))
    Xp = 0.5 * rng.normal(size=(40, 2)) + [0.3, 0.0]
    return np.vstack([Xp, Xn]), np.r_[np.ones(40), np.zeros(200)]


@pytest.mark.parametrize("reg", [1.0, 1e-3])
def test_a_solution_at_w_zero_warns_naming_reg_and_the_data_scale(reg):
    X, y = hull_data()
    with pytest.warns(DegenerateFitWarning, match=rf"degenerate: coef_ is all zero, so the model "
                      rf"ranks every instance alike \(reg={reg:g}; data: max row norm 2.\d+, "
                      r"‖mean x⁺ − mean x⁻‖ = 0.\d+\). Eq. 9's w from the duals had P = [\d.]+ "
                      r"> P\(0\) = 1, worse than w = 0, so coef_ is w = 0 itself. The positives' "
                      r"mean lies in the convex hull of the negatives .*lowering reg cannot "
                      r"help.*logistic regression"):
        model = TopPush(reg=reg).fit(X, y)
    assert model.coef_source_ == "zero" and model.objective_ == model.objective_zero_ == 1.0
    assert model.converged_  # certified by the hull's dual point
    # and it is right: the optimum is w = 0
    tight = TopPush(reg=reg, tol=1e-8, max_iter=50000)
    with pytest.warns(DegenerateFitWarning):
        tight.fit(X, y)
    assert primal_objective(X, y, tight.coef_, reg, "truncated_quadratic") == pytest.approx(
        1.0, abs=1e-6)


def test_large_reg_warns_and_a_lower_reg_does_not():
    X, y = make_data(seed=0, shift=4.0)
    with pytest.warns(DegenerateFitWarning, match=r"reg=1000: w = 0 is within.*Lower reg to"):
        TopPush(reg=1000.0).fit(X, y)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        TopPush(reg=1.0).fit(X, y)


def test_spambase_at_the_authors_reg_is_degenerate_and_says_so(shared_data):
    """On the authors' spambase split at λ = 1, min P is within 0.03 % of P(0) = 1 (the
    optimum's ‖w‖ is about 0.02): the default tol cannot tell the fit from w = 0. The
    positives' mean lies outside the negatives' hull, so a lower reg helps, and the reg the
    warning names is one at which the fit is indeed no longer degenerate."""
    from scipy.io import loadmat

    path = shared_data / "spambase" / "toppush_spambase_split.mat"
    if not path.exists():
        pytest.skip(f"{path} not found")
    d = loadmat(path)
    X, y = d["Xtr"].tocsr(), d["ytr"].ravel()
    with pytest.warns(DegenerateFitWarning, match=r"degenerate at reg=1: w = 0 is within "
                      r"tol=0.02.*‖mean x⁺ − mean x⁻‖ = 0.179.*outside the negatives' convex "
                      r"hull.*Lower reg to") as record:
        model = TopPush(reg=1.0).fit(X, y)
    assert model.objective_ <= model.objective_zero_
    y01 = (y > 0).astype(int)  # the split's labels are ±1
    assert primal_objective(X, y01, model.coef_, 1.0, "truncated_quadratic") <= 1.0
    reg_yes = float(re.search(r"Lower reg to ([\d.e+-]+) or below", str(record[0].message))[1])
    assert 1e-4 < reg_yes < 0.1
    with warnings.catch_warnings():
        warnings.simplefilter("error", DegenerateFitWarning)
        lower = TopPush(reg=reg_yes, random_state=0).fit(X, y)
    assert lower.coef_source_ == "dual" and lower.objective_ < lower.objective_zero_


# --------------------------------------------------------------------------------------------
# never worse than w = 0, and degenerate-fit advice that holds
# --------------------------------------------------------------------------------------------

REGS = [1e-3, 1e-2, 1e-1, 1.0, 10.0]


def planted_hull_data(sparse=False, seed=0):
    """Negatives spread widely around the origin, positives concentrated near the middle: the
    positives' mean lies deep inside the negatives' convex hull, so w = 0 is the optimum of
    eq. 6 at every reg. Sparse: a third of the entries zeroed (in both classes), CSR."""
    rng = np.random.default_rng(seed)
    Xn = 3.0 * rng.normal(size=(300, 6))
    Xp = 0.3 * rng.normal(size=(60, 6)) + 0.2
    X = np.vstack([Xp, Xn])
    y = np.r_[np.ones(60, int), np.zeros(300, int)]
    if sparse:
        X[rng.random(X.shape) < 1 / 3] = 0.0
        return sp.csr_matrix(X), y
    return X, y


def primal_objective_any(X, y, w, reg, loss):
    """Eq. 6 for dense or sparse X, independently of the estimator (float64 throughout)."""
    X = X.toarray() if sp.issparse(X) else np.asarray(X)
    return primal_objective(X.astype(np.float64), np.asarray(y), np.asarray(w, np.float64), reg,
                            loss)


def fit_quietly(**params):
    """(model, messages of the DegenerateFitWarnings) of a fit that may warn."""
    def fit(X, y):
        with warnings.catch_warnings(record=True) as record:
            warnings.simplefilter("always")
            model = TopPush(random_state=0, **params).fit(X, y)
        return model, [str(r.message) for r in record if r.category is DegenerateFitWarning]
    return fit


def test_the_planted_data_has_the_positives_mean_inside_the_negatives_hull():
    """The premise, checked by brute force: a β on the simplex with X⁻ᵀβ = mean x⁺ exists (a
    linear programme), for the dense and the sparse variant."""
    from scipy.optimize import linprog

    for sparse in (False, True):
        X, y = planted_hull_data(sparse)
        X = X.toarray() if sparse else X
        Xn, target = X[y == 0], X[y == 1].mean(axis=0)
        A = np.vstack([Xn.T, np.ones(Xn.shape[0])])
        res = linprog(np.zeros(Xn.shape[0]), A_eq=A, b_eq=np.r_[target, 1.0], bounds=(0, None))
        assert res.status == 0, res.message


@pytest.mark.parametrize("sparse", [False, True])
@pytest.mark.parametrize("reg", REGS)
def test_coef_is_never_worse_than_w_zero_on_planted_hull_data(sparse, reg):
    """The user's report: at every reg from 1e-3 to 10 the fit warned and returned a coef_
    with P between 1.012 and 1.019 > P(0) = 1. Now P(coef_) ≤ P(0), checked with an
    independent numpy P, and objective_ is that number."""
    X, y = planted_hull_data(sparse)
    model, messages = fit_quietly(reg=reg)(X, y)
    p = primal_objective_any(X, y, model.coef_, reg, "truncated_quadratic")
    assert p <= 1.0 + 1e-12, (p, model.coef_source_)
    assert model.objective_ == pytest.approx(p, rel=1e-12, abs=1e-15)
    assert model.objective_zero_ == 1.0 and model.objective_ <= model.objective_zero_
    assert messages and model.coef_source_ == "zero" and not np.any(model.coef_)


@pytest.mark.parametrize("loss", ["logistic", "exponential"])
@pytest.mark.parametrize("sparse", [False, True])
def test_coef_is_never_worse_than_w_zero_for_the_other_losses(loss, sparse):
    X, y = planted_hull_data(sparse, seed=1)
    p_zero = LOSS_AT_ZERO[loss]
    for reg in (1e-3, 1.0):
        model, _ = fit_quietly(reg=reg, loss=loss)(X, y)
        p = primal_objective_any(X, y, model.coef_, reg, loss)
        assert p <= p_zero * (1 + 1e-12) and model.objective_zero_ == p_zero
        assert model.objective_ == pytest.approx(p, rel=1e-12)


@pytest.mark.parametrize("sparse", [False, True])
def test_coef_is_never_worse_than_w_zero_when_reg_is_too_large(sparse):
    """Positives' mean outside the negatives' hull, but reg so large that eq. 6 gains less
    than tol over w = 0: the eq. 9 w of such a fit is worse than 0, and coef_ is the point of
    the steepest-descent ray from w = 0 (same objective test, and it beats w = 0 strictly)."""
    X, y = make_data(seed=0, shift=4.0)
    X = sp.csr_matrix(X) if sparse else X
    for reg in (300.0, 1000.0, 3000.0):
        model, messages = fit_quietly(reg=reg)(X, y)
        p = primal_objective_any(X, y, model.coef_, reg, "truncated_quadratic")
        assert messages and p < 1.0 and model.objective_ == pytest.approx(p, rel=1e-12)
        assert model.coef_source_ in ("dual", "descent_from_zero")


def test_eq9_w_is_kept_when_it_beats_w_zero():
    """The guard changes nothing on a good fit: coef_ is eq. 9 of the returned duals."""
    X, y = make_data(seed=3, shift=4.0)
    model = TopPush(reg=0.5).fit(X, y)
    assert model.coef_source_ == "dual" and model.objective_ < 0.9
    w = (model.dual_alpha_ @ X[y == 1] - model.dual_beta_ @ X[y == 0]) / (0.5 * y.sum())
    np.testing.assert_allclose(model.coef_, w, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("sparse", [False, True])
def test_the_guard_reports_a_feasible_dual_and_the_warning_says_what_it_did(sparse):
    """When coef_ is w = 0, the duals returned are the hull's dual point (α = ℓ'(0), β on the
    top negatives): feasible, g(α, β) = dual_objective_, and its bound certifies w = 0."""
    X, y = planted_hull_data(sparse)
    model, messages = fit_quietly(reg=0.1)(X, y)
    assert "so coef_ is w = 0 itself" in messages[0]
    a, b = model.dual_alpha_, model.dual_beta_
    assert a.min() >= 0 and b.min() >= 0 and a.sum() == pytest.approx(b.sum(), rel=1e-12)
    Xd = X.toarray() if sparse else X
    nu = a @ Xd[y == 1] - b @ Xd[y == 0]
    g = nu @ nu / (2 * 0.1 * y.sum()) + np.sum(a * a / 4 - a)
    assert model.dual_objective_ == pytest.approx(g, rel=1e-9)
    lower = -g / y.sum()
    assert lower <= model.objective_ and model.objective_ - lower <= model.tol * lower
    assert model.converged_


def test_a_capped_fit_worse_than_w_zero_is_guarded_and_the_convergence_warning_says_so():
    X, y = make_data(seed=0, shift=4.0)
    with pytest.warns(ConvergenceWarning, match=r"max_iter=1 .*P = [\d.]+ > P\(0\) = 1, worse "
                      r"than w = 0, so coef_ is instead the minimizer of eq. 6 along"):
        model = TopPush(reg=1000.0, max_iter=1, tol=1e-15).fit(X, y)
    assert model.coef_source_ == "descent_from_zero" and not model.converged_
    assert primal_objective(X, y, model.coef_, 1000.0, "truncated_quadratic") < 1.0


LOWER_REG = re.compile(r"\blower reg\b", re.IGNORECASE)


@pytest.mark.parametrize("sparse", [False, True])
def test_advice_does_not_say_lower_reg_where_lowering_does_not_change_the_result(sparse):
    """Positives' mean inside the negatives' hull: at every reg the warning says lowering reg
    cannot help (and names what can), never "lower reg", and indeed a 1000 times lower reg
    gives the same result (coef_ = 0, objective P(0))."""
    X, y = planted_hull_data(sparse)
    for reg in (10.0, 1.0, 1e-3):
        model, messages = fit_quietly(reg=reg)(X, y)
        assert len(messages) == 1, messages
        assert not LOWER_REG.search(messages[0]), messages[0]
        assert "lowering reg cannot help" in messages[0]
        assert "logistic regression" in messages[0]
        lower, _ = fit_quietly(reg=reg / 1000)(X, y)
        assert not np.any(lower.coef_) and lower.objective_ == model.objective_ == 1.0


def test_advice_says_lower_reg_where_it_helps_and_names_a_reg_that_does():
    """Positives' mean outside the negatives' hull, reg too large: the warning says "Lower reg
    to R or below", and at R the fit is no longer degenerate (no warning, eq. 9's w kept, and
    min P more than tol below P(0)); its bound "w = 0 stays within tol of the optimum at every
    reg >= B" holds too (checked at B with tight fits)."""
    X, y = make_data(seed=0, shift=4.0)
    model, messages = fit_quietly(reg=1000.0)(X, y)
    (message,) = messages
    assert LOWER_REG.search(message) and "outside the negatives' convex hull" in message
    reg_yes = float(re.search(r"Lower reg to ([\d.e+-]+) or below", message)[1])
    reg_no = float(re.search(r"at every reg >= ([\d.e+-]+)", message)[1])
    assert reg_yes < reg_no < 1000.0
    helped, after = fit_quietly(reg=reg_yes)(X, y)
    assert not after and helped.coef_source_ == "dual" and helped.objective_ < 1.0
    tight, _ = fit_quietly(reg=reg_yes, tol=1e-8, max_iter=100000)(X, y)
    assert tight.objective_ < 1.0 / (1 + helped.tol)  # min P is more than tol below P(0)
    tight, _ = fit_quietly(reg=reg_no, tol=1e-8, max_iter=100000)(X, y)
    assert tight.objective_ >= 1.0 / (1 + helped.tol) - 1e-9  # min P within tol of P(0)


# --------------------------------------------------------------------------------------------
# the pieces of the w = 0 analysis against slow references
# --------------------------------------------------------------------------------------------


def nearest_hull_point_reference(Xn, target):
    """min_β ‖Xnᵀβ − target‖ over the simplex by SLSQP (slow, small problems only)."""
    from scipy.optimize import minimize

    n = Xn.shape[0]
    res = minimize(lambda b: 0.5 * np.sum((Xn.T @ b - target) ** 2), np.full(n, 1.0 / n),
                   jac=lambda b: Xn @ (Xn.T @ b - target), bounds=[(0, None)] * n,
                   constraints=[{"type": "eq", "fun": lambda b: b.sum() - 1.0,
                                 "jac": lambda b: np.ones(n)}],
                   method="SLSQP", options={"ftol": 1e-14, "maxiter": 2000})
    return float(np.linalg.norm(Xn.T @ res.x - target))


@pytest.mark.parametrize("seed", [0, 1, 2, 3])
def test_hull_distance_matches_a_slow_reference(seed):
    """zero_analysis's δ̂ is an upper bound on the distance of the positives' mean to the
    negatives' hull within the documented accuracy (Frank-Wolfe gap ≤ 25 % of f: δ̂ ≤ 1.16 δ);
    inside the hull it is ≈ 0."""
    rng = np.random.default_rng(seed)
    Xn = rng.normal(size=(40, 4)) * [1.0, 5.0, 0.2, 1.0]  # unequal column scales
    shift = [0.0, 0.5, 1.0, 3.0][seed]
    Xp = rng.normal(size=(15, 4)) * 0.3 + shift
    X = np.vstack([Xp, Xn])
    delta_ref = nearest_hull_point_reference(Xn, Xp.mean(axis=0))
    info = toppush_solver.zero_analysis(X, 15, 1.0, K.TRUNCATED_QUADRATIC, 0.02)
    if delta_ref < 1e-6:
        assert info["status"] == "inside" and info["delta"] < 1e-6
    else:
        assert info["status"] == "outside"
        assert delta_ref * (1 - 1e-6) <= info["delta"] <= 1.16 * delta_ref
        u = info["direction"]  # separates: the positives' mean scores above every negative
        assert Xp.mean(axis=0) @ u > np.max(Xn @ u)
    # the dual bound behind reg_no: min P(λ') ≥ ℓ(0) − ℓ'(0)² δ̂²/(2λ'), checked at λ' = reg_no
    # against a tight fit
    if info["status"] == "outside":
        y = np.r_[np.ones(15), np.zeros(40)]
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DegenerateFitWarning)
            tight = TopPush(reg=info["reg_no"], tol=1e-9, max_iter=100000).fit(X, y)
        p_opt = primal_objective(X, y, tight.coef_, info["reg_no"], "truncated_quadratic")
        assert p_opt >= 1.0 - 4 * info["delta"] ** 2 / (2 * info["reg_no"]) - 1e-9
        assert p_opt >= 1.0 / (1 + 0.02) - 1e-9  # w = 0 within tol at reg_no


@pytest.mark.parametrize("loss", [K.TRUNCATED_QUADRATIC, K.LOGISTIC, K.EXPONENTIAL])
def test_ray_minimum_matches_a_grid_search(loss):
    rng = np.random.default_rng(loss)
    c = rng.normal(size=50) - 0.3  # mean < 0: P decreases from t = 0
    t, value = toppush_solver.ray_minimum(c, 2.0, 0.1, loss)
    ts = np.linspace(0.0, 4 * max(t, 1.0), 200001)
    name = LOSSES[loss]
    ell = {"truncated_quadratic": lambda z: np.maximum(1 + z, 0) ** 2,
           "logistic": lambda z: np.logaddexp(0, z), "exponential": np.exp}[name]
    grid = [0.05 * s * s * 2.0 + ell(s * c).mean() for s in ts[::100]]
    assert value <= min(grid) + 1e-9 and value == pytest.approx(
        0.05 * t * t * 2.0 + ell(t * c).mean(), rel=1e-12)
    # the certificate behind reg_yes: at that reg some point of the ray is below the level
    level = LOSS_AT_ZERO[name] / 1.02
    reg_yes = toppush_solver.largest_reg_below(c, 2.0, loss, level)
    assert reg_yes > 0 and toppush_solver.ray_minimum(c, 2.0, reg_yes, loss)[1] < level
    assert toppush_solver.ray_minimum(c, 2.0, 1.5 * reg_yes, loss)[1] >= level * (1 - 0.05)
    # no descent along u: t = 0
    assert toppush_solver.ray_minimum(np.abs(c), 2.0, 0.1, loss) == (0.0, LOSS_AT_ZERO[name])


def test_objective_and_coef_source_survive_save_and_load(tmp_path):
    X, y = planted_hull_data()
    model, _ = fit_quietly(reg=1.0)(X, y)
    model.save(tmp_path / "tp")
    loaded = TopPush.load(tmp_path / "tp")
    assert loaded.objective_ == model.objective_ and loaded.coef_source_ == "zero"
    assert loaded.objective_zero_ == 1.0
