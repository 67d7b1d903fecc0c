"""One contract, every estimator (implicit's RecommenderBaseTestMixin pattern): keyword-only
constructors that only store parameters, ``fit`` returning ``self``, learned attributes ending in
``_``, one NotFittedError, get/set_params round trips, a ConvergenceWarning that says what to
change, warm state as plain arrays tagged with the algorithm, ``save``/``load`` without pickle
that reproduce the model's scores and warm state, and errors that name both values."""

from __future__ import annotations

import inspect
import json
import re
import warnings

import numpy as np
import pytest

import solvers
from solvers import NPSVOR, AltSVM, ConvergenceWarning, KernelRankSVM, NotFittedError, TopPush


def _altsvm_data():
    rng = np.random.default_rng(0)
    users = rng.integers(0, 30, 600)
    winners = rng.integers(0, 20, 600)
    losers = (winners + rng.integers(1, 20, 600)) % 20
    return (np.column_stack([users, winners, losers]),), {}


def _toppush_data():
    rng = np.random.default_rng(0)
    X = rng.normal(size=(300, 6))
    y = (X[:, 0] + 0.3 * rng.normal(size=300) > 1.0).astype(int)
    return (X, y), {"ids": np.arange(300)}


def _npsvor_data():
    rng = np.random.default_rng(0)
    X = rng.normal(size=(300, 6))
    y = np.digitize(X[:, 0] + 0.3 * rng.normal(size=300), [-0.8, 0.0, 0.8]) + 1
    return (X, y), {"ids": np.arange(300)}


def _ranksvm_data():
    rng = np.random.default_rng(0)
    X = rng.normal(size=(200, 5))
    y = np.digitize(X[:, 0] + 0.3 * rng.normal(size=200), [-0.5, 0.5])
    return (X, y, np.repeat(np.arange(20), 10)), {}


def _altsvm_scores(model):
    return model.predict(np.repeat(np.arange(5), 20), np.tile(np.arange(20), 5))


def _toppush_scores(model):
    return model.decision_function(np.random.default_rng(1).normal(size=(50, 6)))


def _npsvor_scores(model):
    return model.predict_score(np.random.default_rng(1).normal(size=(50, 6)))


def _ranksvm_scores(model):
    return model.decision_function(np.random.default_rng(1).normal(size=(50, 5)))


def _altsvm_bad(model):
    """(call, message) of a call with a wrong value; the message must name both values."""
    return (lambda: model.predict([0], [25]),
            "items[0] is 25, but the model has 20 items")


def _toppush_bad(model):
    return (lambda: model.decision_function(np.zeros((2, 5))),
            "X has 5 features, the model was trained with 6")


def _npsvor_bad(model):
    return (lambda: model.predict(np.zeros((2, 5))),
            "X has 5 features, the model was trained with 6")


def _ranksvm_bad(model):
    return (lambda: model.decision_function(np.zeros((2, 4))),
            "X has 4 features, the model was trained with 5")


CASES = {
    "AltSVM": (AltSVM, {"rank": 3, "reg_ratio": 0.3, "random_state": 0, "n_threads": 1},
               _altsvm_data, _altsvm_scores, _altsvm_bad),
    "TopPush": (TopPush, {"reg": 1.0, "random_state": 0}, _toppush_data, _toppush_scores,
                _toppush_bad),
    "NPSVOR": (NPSVOR, {"C1": 1.0, "random_state": 0, "n_threads": 1}, _npsvor_data,
               _npsvor_scores, _npsvor_bad),
    "KernelRankSVM": (KernelRankSVM, {"C": 1.0, "gamma": 0.2, "random_state": 0,
                                      "n_threads": 1}, _ranksvm_data, _ranksvm_scores,
                      _ranksvm_bad),
}


def test_every_estimator_family_is_covered():
    assert set(CASES) == set(solvers.ESTIMATORS)


@pytest.fixture(params=sorted(CASES))
def case(request):
    return CASES[request.param]


def test_constructor_is_keyword_only_and_only_stores(case):
    cls, params, *_ = case
    signature = inspect.signature(cls.__init__)
    kinds = {p.kind for name, p in signature.parameters.items() if name != "self"}
    assert kinds == {inspect.Parameter.KEYWORD_ONLY}
    with pytest.raises(TypeError):
        cls(1.0)
    model = cls(**params)
    for name, value in params.items():
        assert getattr(model, name) == value
    assert not [a for a in vars(model) if a.endswith("_") and not a.startswith("_")]


def test_every_parameter_has_a_declared_constraint_and_is_checked(case):
    """The ``_parameter_constraints`` table names every constructor parameter, and a value no
    constraint allows (a list: no parameter takes one) is refused with a message naming the
    parameter and the value."""
    cls, params, *_ = case
    assert set(cls._parameter_constraints) == set(cls.param_names())
    for name in cls.param_names():
        with pytest.raises(ValueError, match=rf"{name}\b.* is \[7\]|{name} is \[7\]"):
            cls(**{**params, name: [7]}).validate_params()


def test_a_family_without_its_abstract_parts_cannot_be_built():
    class Half(solvers._base.Estimator):
        def fit(self, X):
            return self

    with pytest.raises(TypeError, match="abstract"):
        Half()


def test_fit_returns_self_with_learned_attributes(case):
    cls, params, data, *_ = case
    args, kwargs = data()
    model = cls(**params)
    assert model.fit(*args, **kwargs) is model
    learned = [a for a in vars(model) if a.endswith("_") and not a.startswith("_")]
    assert "n_iter_" in learned and model.n_iter_ >= 1
    assert len(learned) >= 2


def test_convergence_warning_says_what_to_change(case):
    cls, params, data, *_ = case
    args, kwargs = data()
    with pytest.warns(ConvergenceWarning, match="max_iter"):
        cls(**{**params, "max_iter": 1, "tol": 1e-15}).fit(*args, **kwargs)


def test_warm_state_is_plain_arrays(case):
    cls, params, data, *_ = case
    args, kwargs = data()
    state = cls(**params).fit(*args, **kwargs).warm_state()
    assert isinstance(state, dict) and state
    for key, value in state.items():
        assert isinstance(value, np.ndarray), key
        assert value.dtype != object, key


def test_warm_start_from_its_own_state_is_cheap(case):
    cls, params, data, *_ = case
    args, kwargs = data()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        cold = cls(**params).fit(*args, **kwargs)
        warm = cls(**params).fit(*args, **kwargs, warm_start=cold.warm_state())
    assert warm.n_iter_ <= 2


def test_save_load_without_pickle_reproduces_scores(case, tmp_path):
    cls, params, data, scores, _ = case
    args, kwargs = data()
    model = cls(**params).fit(*args, **kwargs)
    model.save(tmp_path / "m")
    manifest = json.loads((tmp_path / "m" / "manifest.json").read_text())
    assert manifest["format_version"] >= 1
    with np.load(tmp_path / "m" / "arrays.npz", allow_pickle=False) as z:
        assert all(z[k].dtype != object for k in z.files)
    loaded = cls.load(tmp_path / "m")
    np.testing.assert_array_equal(scores(loaded), scores(model))
    for key, value in model.warm_state().items():
        np.testing.assert_array_equal(loaded.warm_state()[key], value)


def test_unfitted_model_raises_not_fitted_error(case):
    cls, params, *_ = case
    model = cls(**params)
    with pytest.raises(NotFittedError, match="not fitted yet"):
        model.warm_state()
    with pytest.raises(NotFittedError):
        model.save("never-written")


def test_get_set_params_round_trip(case):
    cls, params, *_ = case
    model = cls(**params)
    clone = cls(**model.get_params())
    assert clone.get_params() == model.get_params()
    assert model.set_params(**params) is model
    with pytest.raises(ValueError, match=f"{cls.__name__} has no parameter 'nope'"):
        model.set_params(nope=1)


def test_warm_state_is_tagged_and_checked(case):
    cls, params, data, *_ = case
    args, kwargs = data()
    state = cls(**params).fit(*args, **kwargs).warm_state()
    assert str(state["algorithm"]) == cls.algorithm
    missing = dict(state)
    dropped = cls.warm_keys[0]
    del missing[dropped]
    with pytest.raises(ValueError, match=f"lacks \\['{dropped}'\\]"):
        cls(**params).fit(*args, **kwargs, warm_start=missing)
    foreign = {**state, "algorithm": np.array("Other")}
    with pytest.raises(ValueError, match=f"'Other' model, this is a '{cls.algorithm}' model"):
        cls(**params).fit(*args, **kwargs, warm_start=foreign)


def test_errors_name_both_values(case):
    cls, params, data, _, bad = case
    args, kwargs = data()
    call, message = bad(cls(**params).fit(*args, **kwargs))
    with pytest.raises(ValueError, match=re.escape(message)):
        call()


def test_star_import_gives_every_public_name():
    """``from solvers import *`` imports every name of ``solvers.__all__`` (each one resolves),
    among them every registered estimator."""
    namespace: dict = {}
    exec("from solvers import *", namespace)
    missing = [name for name in solvers.__all__ if name not in namespace]
    assert not missing, missing
    assert set(solvers.ESTIMATORS) <= set(namespace)
