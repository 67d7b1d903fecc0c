"""TopPush estimator: optimality (duality gap, gradient), warm start, dtypes and storage,
persistence, input validation, and a real-data check on the authors' spambase split."""

from __future__ import annotations

import doctest
import warnings

import numpy as np
import pytest
import scipy.sparse as sp

import solvers._toppush_solver as toppush_solver
import solvers.toppush as toppush_module
from solvers import ConvergenceWarning, NotFittedError, TopPush
from solvers import _toppush_kernels as K
from solvers._bipartite_metrics import auc, average_precision, pos_at_top

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
    X, y = make_data(m=300, n=1500, seed=13, shift=2.0)
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
    random splits, λ by cross-validation): Pos@Top .129 ± .077, AP .922, NDCG .988, AUC .942."""
    from scipy.io import loadmat

    path = shared_data / "spambase" / "toppush_spambase_split.mat"
    if not path.exists():
        pytest.skip(f"{path} not found")
    d = loadmat(path)
    Xtr, Xte = d["Xtr"].tocsr(), d["Xte"].tocsr()
    ytr, yte = d["ytr"].ravel(), d["yte"].ravel()
    with warnings.catch_warnings():
        warnings.simplefilter("error", ConvergenceWarning)
        model = TopPush(reg=1.0).fit(Xtr, ytr)
    scores = model.decision_function(Xte)
    assert 0.02 <= pos_at_top(yte, scores) <= 0.4
    assert average_precision(yte, scores) >= 0.90
    assert auc(yte, scores) >= 0.92


def test_shrinking_reaches_the_optimum_of_the_full_problem(capsys, monkeypatch):
    """Shrinking removes low-scored negatives from the working problem; when a removed one turns
    out to want β > 0 at the end, all come back. This data set takes that path."""
    X, y = make_data(m=100, n=1000, seed=2)
    shrunk = TopPush(tol=1e-10, max_iter=20000, verbose=True, random_state=0).fit(X, y)
    log = capsys.readouterr().out
    assert "shrinking:" in log and "back to all 1000 negatives" in log
    monkeypatch.setattr(toppush_solver, "SHRINK", False)
    full = TopPush(tol=1e-10, max_iter=20000, random_state=0).fit(X, y)
    assert shrunk.dual_objective_ == pytest.approx(full.dual_objective_, rel=1e-7)
    np.testing.assert_allclose(shrunk.coef_, full.coef_, rtol=1e-3, atol=1e-4)
    # KKT: the negatives carrying β are the top-scored ones
    neg_scores = X[y == 0] @ shrunk.coef_
    carrying = shrunk.dual_beta_ > 1e-9 * shrunk.dual_beta_.max()
    spread = neg_scores.max() - neg_scores.min()
    assert neg_scores[carrying].min() >= neg_scores.max() - 1e-3 * spread
