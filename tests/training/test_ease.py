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
    with pytest.raises(ValueError, match="a column per item"):
        method.user_factor(None, V[:, :5], None, met, pairs, {})


def test_on_some_items_the_factor_form_and_the_fold_in_are_exact_on_them():
    """EASE on the columns ``items`` only: U Vᵀ is X[:, items] B on those items and 0 on the
    others; a new user's factor has a 1 in the column of each of their listed items."""
    X = _binary(seed=2)
    items = np.array([0, 2, 3, 7, 11, 13, 20, 24])
    B = ease.ease_weights(X[:, items], 5.0)
    U, V, _ = ease.factors(X, B, items)
    assert U.shape == (60, 8) and V.shape == (25, 8)
    want = np.zeros((60, 25), np.float32)
    want[:, items] = X[:, items].toarray() @ B
    np.testing.assert_allclose(U @ V.T, want, rtol=1e-5, atol=1e-6)
    method = fold_in_method("item_item")
    spec = {"method": "item_item", "items": items.tolist()}
    method.check(spec)
    u = method.user_factor(None, V, None, np.array([3, 5, 11]), np.array([[20, 4]]), spec)
    x = np.zeros(25, np.float32)
    x[[3, 11, 20]] = 1.0              # 5 has no column: it adds nothing
    np.testing.assert_allclose(V @ u, (x[items] @ B) @ np.eye(25, dtype=np.float32)[items],
                               rtol=1e-6)
    for bad in ([1, 1], [-1], "0,1"):
        with pytest.raises(ValueError, match="distinct item indices"):
            method.check({"method": "item_item", "items": bad})


def _cfg(**tune):
    return parse_model("movies", {"algorithm": "altsvm", "kinds": ["rating"],
                                  "gate": {"challenger": ["als", "ease"]},
                                  "tune": {"budget_seconds": 5, "max_settings": 3, **tune}},
                       "test")


def test_a_large_catalogue_gets_its_most_met_items_and_too_little_memory_skips_it(
        monkeypatch):
    """Up to tune.ease_max_items every item; past it the cap² / n_items most met (V, n_items x
    N floats, never over cap²); under MIN_ITEMS of them, or without the memory: skipped, with
    one line."""
    from scipy.sparse import csr_matrix

    def counts(n_items):    # item j met by j % 7 + 1 users
        cols = np.concatenate([np.full(j % 7 + 1, j) for j in range(n_items)])
        rows = np.arange(len(cols)) % 50
        return csr_matrix((np.ones(len(cols), np.float32), (rows, cols)), shape=(50, n_items))

    assert ease.columns(counts(1000), 50, _cfg()) == (None, None)
    items, reason = ease.columns(counts(600), 50, _cfg(ease_max_items=500))
    assert reason is None and len(items) == 500 * 500 // 600 == 416
    assert list(items) == sorted(items)
    met = np.asarray(counts(600).sum(axis=0)).ravel()
    assert met[items].min() >= np.delete(met, items).max()          # the most met
    items, reason = ease.columns(counts(3000), 50, _cfg(ease_max_items=500))
    assert items is None and "3,000 items leave 83 columns" in reason and "\n" not in reason
    flat = csr_matrix((np.ones(2000, np.float32), (np.arange(2000) % 50, np.arange(2000) % 1000)),
                      shape=(50, 1000))     # every item met twice: 250 columns hold 25%
    items, reason = ease.columns(flat, 50, _cfg(ease_max_items=500))
    assert items is None and "its 250 most-met of 1,000 items hold 25% of the met rows, " \
        "under 50%" in reason and "\n" not in reason
    monkeypatch.setattr(ease, "available_memory", lambda: 2 * 2**20)
    items, reason = ease.columns(counts(1000), 50, _cfg())
    assert "over half of the 0.0 GiB of memory available" in reason and "\n" not in reason


def test_config_takes_a_list_of_challengers():
    assert _cfg().gate["challenger"] == ["als", "ease"]
    for bad in (["als", "als"], ["bpr"], []):
        with pytest.raises(ValueError, match="expected a list of distinct names"):
            parse_model("movies", {"algorithm": "altsvm", "gate": {"challenger": bad}}, "t")


@pytest.mark.filterwarnings("ignore::solvers.ConvergenceWarning")
@pytest.mark.parametrize("cap", [5000, 130], ids=["every item", "the most met items"])
def test_ease_is_tuned_gated_published_looked_up_and_folded_in(tmp_path, redis_url,
                                                              redis_client, monkeypatch, cap):
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
           "tune": {"budget_seconds": 30, "max_settings": 3, "ease_max_items": cap}}
    models = {"movies": parse_model("movies", raw, "test")}
    run = retrain.run("movies", models, settings=settings, redis_url=redis_url)
    gate, ch = run["gate"], run["train"]["challenger"]
    assert ch["name"] == "ease" and gate["metric"] in ch["metrics"], ch
    columns = ch["tried"][-1]["chosen"].get("items")      # 130² / the items the events met
    assert columns is None if cap == 5000 else 130 * 130 // 150 <= columns < 130, columns
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
    with TopK(redis_url, namespace=settings.namespace) as topk:    # why: the terms add up
        item, score = answer.items[0]
        why = topk.explain("movies", events[0]["user"], item, k=50)
    assert why.method == "item_item" and abs(why.residual) < 1e-4
    assert sum(c["term"] for c in why.contributions) == pytest.approx(score, abs=1e-4)
    # warm: the last λ is reused
    again = retrain.run("movies", models, settings=settings, redis_url=redis_url, cold=False)
    assert again["decision"] in ("unchanged", "published", "rejected")
