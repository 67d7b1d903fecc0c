"""One contract, every estimator (implicit's RecommenderBaseTestMixin pattern): keyword-only
constructors that only store parameters, ``fit`` returning ``self``, learned attributes ending in
``_``, a ConvergenceWarning that says what to change, warm state as plain arrays, and
``save``/``load`` without pickle that reproduce the model's scores."""

from __future__ import annotations

import inspect
import json
import warnings

import numpy as np
import pytest

from solvers import AltSVM, ConvergenceWarning, TopPush


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


def _altsvm_scores(model):
    return model.predict(np.repeat(np.arange(5), 20), np.tile(np.arange(20), 5))


def _toppush_scores(model):
    return model.decision_function(np.random.default_rng(1).normal(size=(50, 6)))


CASES = {
    "AltSVM": (AltSVM, {"rank": 3, "reg": 1.0, "random_state": 0, "n_threads": 1},
               _altsvm_data, _altsvm_scores),
    "TopPush": (TopPush, {"reg": 1.0, "random_state": 0}, _toppush_data, _toppush_scores),
}


@pytest.fixture(params=sorted(CASES))
def case(request):
    return CASES[request.param]


def test_constructor_is_keyword_only_and_only_stores(case):
    cls, params, _, _ = case
    signature = inspect.signature(cls.__init__)
    kinds = {p.kind for name, p in signature.parameters.items() if name != "self"}
    assert kinds == {inspect.Parameter.KEYWORD_ONLY}
    with pytest.raises(TypeError):
        cls(1.0)
    model = cls(**params)
    for name, value in params.items():
        assert getattr(model, name) == value
    assert not [a for a in vars(model) if a.endswith("_") and not a.startswith("_")]


def test_fit_returns_self_with_learned_attributes(case):
    cls, params, data, _ = case
    args, kwargs = data()
    model = cls(**params)
    assert model.fit(*args, **kwargs) is model
    learned = [a for a in vars(model) if a.endswith("_") and not a.startswith("_")]
    assert "n_iter_" in learned and model.n_iter_ >= 1
    assert len(learned) >= 2


def test_convergence_warning_says_what_to_change(case):
    cls, params, data, _ = case
    args, kwargs = data()
    with pytest.warns(ConvergenceWarning, match="max_iter"):
        cls(**{**params, "max_iter": 1, "tol": 1e-15}).fit(*args, **kwargs)


def test_warm_state_is_plain_arrays(case):
    cls, params, data, _ = case
    args, kwargs = data()
    state = cls(**params).fit(*args, **kwargs).warm_state()
    assert isinstance(state, dict) and state
    for key, value in state.items():
        assert isinstance(value, np.ndarray), key
        assert value.dtype != object, key


def test_warm_start_from_its_own_state_is_cheap(case):
    cls, params, data, _ = case
    args, kwargs = data()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        cold = cls(**params).fit(*args, **kwargs)
        warm = cls(**params).fit(*args, **kwargs, warm_start=cold.warm_state())
    assert warm.n_iter_ <= 2


def test_save_load_without_pickle_reproduces_scores(case, tmp_path):
    cls, params, data, scores = case
    args, kwargs = data()
    model = cls(**params).fit(*args, **kwargs)
    model.save(tmp_path / "m")
    manifest = json.loads((tmp_path / "m" / "manifest.json").read_text())
    assert manifest["format_version"] >= 1
    with np.load(tmp_path / "m" / "arrays.npz", allow_pickle=False) as z:
        assert all(z[k].dtype != object for k in z.files)
    loaded = cls.load(tmp_path / "m")
    np.testing.assert_array_equal(scores(loaded), scores(model))
