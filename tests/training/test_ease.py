"""EASE, AltSVM's item-item challenger: the closed form against a float64 reference, its exact
factor form and fold-in, the skip with its reason, and end to end (real event store and
redis-server): tuned, gated, published as ``challenger-ease``, looked up and folded in."""

from __future__ import annotations

import numpy as np
import pytest
from scipy.sparse import csr_matrix

from pipeline.ingest import synthetic
from pipeline.ingest.files import ingest_files
from pipeline.serving.item_queries import fold_in_method
from pipeline.serving.lookup import TopK
from pipeline.settings import Settings
from pipeline.training import retrain
from pipeline.training.config import parse_model
from pipeline.training.trainers import ease


def _binary(n_users=60, n_items=25, density=0.2, seed=0):
    rng = np.random.default_rng(seed)
    return csr_matrix((rng.random((n_users, n_items)) < density).astype(np.float32))


def _reference(X, lam: float) -> np.ndarray:
    """Steck 2019, eq. 8, in float64: B = I − P diag(1 / diag P), P = (XᵀX + λI)⁻¹."""
    G = X.T.toarray().astype(np.float64) @ X.toarray().astype(np.float64)
    P = np.linalg.inv(G + lam * np.eye(G.shape[0]))
    return np.eye(G.shape[0]) - P / np.diag(P)[None, :]


@pytest.mark.parametrize("lam", [0.5, 10.0, 300.0])
def test_the_closed_form_matches_a_float64_reference(lam):
    X = _binary()
    B = ease.ease_weights(X, lam)
    assert B.dtype == np.float32 and B.shape == (25, 25)
    np.testing.assert_allclose(B, _reference(X, lam), rtol=1e-3, atol=1e-5)
    assert np.all(np.diag(B) == 0)
    # optimality: the gradient of ‖X − XB‖² + λ‖B‖² vanishes off the diagonal
    Xd = X.toarray().astype(np.float64)
    grad = -Xd.T @ (Xd - Xd @ B) + lam * B
    off = ~np.eye(25, dtype=bool)
    assert np.abs(grad[off]).max() < 1e-3 * max(1.0, np.abs(Xd.T @ Xd).max())


def test_the_factor_form_and_the_fold_in_are_exact():
    X = _binary(seed=1)
    B = ease.ease_weights(X, 5.0)
    U, V, b = ease.factors(X, B)
    assert b is None and U.shape == (60, 25) and V.shape == (25, 25)
    np.testing.assert_allclose(U @ V.T, X.toarray() @ B, rtol=1e-5, atol=1e-6)
    method = fold_in_method("item_item")
    met, pairs = np.array([3, 7, 11]), np.array([[20, 4]])
    u = method.user_factor(None, V, None, met, pairs, {"method": "item_item"})
    x = np.zeros(25, np.float32)
    x[[3, 7, 11, 20]] = 1.0
    np.testing.assert_allclose(V @ u, x @ B, rtol=1e-6)
    with pytest.raises(ValueError, match="square item factors"):
        method.user_factor(None, V[:, :5], None, met, pairs, {})


def _cfg(**tune):
    return parse_model("movies", {"algorithm": "altsvm", "kinds": ["rating"],
                                  "gate": {"challenger": ["als", "ease"]},
                                  "tune": {"budget_seconds": 5, "max_settings": 3, **tune}},
                       "test")


def test_too_many_items_or_too_little_memory_skips_it_with_one_line(monkeypatch):
    reason = ease.too_large(100, 6000, _cfg())
    assert "6,000 items is over tune.ease_max_items 5,000" in reason and "\n" not in reason
    assert ease.too_large(100, 50, _cfg(ease_max_items=40)) is not None
    assert ease.too_large(100, 1000, _cfg()) is None or ease.available_memory() < 2**26
    monkeypatch.setattr(ease, "available_memory", lambda: 2 * 2**20)
    reason = ease.too_large(100, 1000, _cfg())
    assert "over half of the 0.0 GiB of memory available" in reason and "\n" not in reason


def test_config_takes_a_list_of_challengers():
    assert _cfg().gate["challenger"] == ["als", "ease"]
    for bad in (["als", "als"], ["bpr"], []):
        with pytest.raises(ValueError, match="expected a list of distinct names"):
            parse_model("movies", {"algorithm": "altsvm", "gate": {"challenger": bad}}, "t")


@pytest.mark.filterwarnings("ignore::solvers.ConvergenceWarning")
def test_ease_is_tuned_gated_published_looked_up_and_folded_in(tmp_path, redis_url,
                                                              redis_client, monkeypatch):
    ridges = []    # λ of every fit, in order: the search's on TRAIN, then the final two
    real = ease.ease_weights
    monkeypatch.setattr(ease, "ease_weights", lambda X, lam: ridges.append(lam) or real(X, lam))
    settings = Settings(home=tmp_path / "home", namespace=f"e{tmp_path.name[-12:]}")
    events = synthetic.rating_events(n_users=300, n_items=150, per_user=30, seed=1,
                                     choice=3.0)
    path = synthetic.write_jsonl(events, settings.home / "in" / "taste.jsonl")
    ingest_files([path], "rating", settings=settings, progress=False)
    # AltSVM with one factor and λ fixed cannot say much: a challenger wins
    raw = {"algorithm": "altsvm", "kinds": ["rating"], "evaluation": {"holdout": 4},
           "params": {"item_bias": True, "max_iter": 40, "random_state": 0, "n_threads": 1,
                      "rank": 1, "reg_ratio": 0.3},
           "gate": {"challenger": ["ease"]},
           "tune": {"budget_seconds": 30, "max_settings": 3}}
    models = {"movies": parse_model("movies", raw, "test")}
    run = retrain.run("movies", models, settings=settings, redis_url=redis_url)
    gate, ch = run["gate"], run["train"]["challenger"]
    assert ch["name"] == "ease" and gate["metric"] in ch["metrics"], ch
    searched = [t for t in ch["tried"] if "params" in t]
    assert 2 <= len(searched) <= ease.MAX_LAMBDAS
    chosen = ch["tried"][-1]["chosen"]["lambda"]
    assert chosen in {t["params"]["lambda"] for t in searched}
    # the λ chosen on TRAIN fits the holdout's and the published fit as it is: the best λ
    # does not grow with the rows, so it is not rescaled by their larger mean count
    assert ridges[-2:] == [chosen, chosen], (ridges, chosen)
    assert run["decision"] == "published" and gate["publishes"] == "challenger-ease", gate
    with TopK(redis_url, namespace=settings.namespace) as topk:
        answer = topk.recommend("movies", events[0]["user"], k=5)
        assert answer.source == "challenger-ease" and len(answer.items) == 5
        mine = [e["item"] for e in events if e["user"] == events[0]["user"]][:8]
        folded = topk.fold_in("movies", mine, k=5)
    assert folded.source != "fallback" and len(folded.items) == 5
    assert not set(mine) & {i for i, _ in folded.items}        # their items are left out
    # warm: the last λ is reused
    again = retrain.run("movies", models, settings=settings, redis_url=redis_url, cold=False)
    assert again["decision"] in ("unchanged", "published", "rejected")
