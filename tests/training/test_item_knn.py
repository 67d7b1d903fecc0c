"""Item-kNN, AltSVM's sparse item-item challenger, end to end (real event store and
redis-server): tuned on validation, gated, published with sparse factors as
``challenger-knn``, looked up, folded in and explained; a warm run reuses its setting; and a
blend with it (dense and sparse factors together) is published and answers as scored."""

from __future__ import annotations

import numpy as np
import pytest

from pipeline.ingest import synthetic
from pipeline.ingest.files import ingest_files
from pipeline.serving.lookup import TopK
from pipeline.settings import Settings
from pipeline.training import retrain
from pipeline.training.config import parse_model
from pipeline.training.trainers import blends, item_knn


def _setup(tmp_path):
    settings = Settings(home=tmp_path / "home", namespace=f"k{tmp_path.name[-12:]}")
    events = synthetic.rating_events(n_users=300, n_items=150, per_user=30, seed=1,
                                     choice=3.0)
    path = synthetic.write_jsonl(events, settings.home / "in" / "taste.jsonl")
    ingest_files([path], "rating", settings=settings, progress=False)
    return settings, events


def _models(challengers, mode="replace", **tune):
    # AltSVM with one factor and λ fixed cannot say much: a challenger wins
    raw = {"algorithm": "altsvm", "kinds": ["rating"], "evaluation": {"holdout": 4},
           "params": {"item_bias": True, "max_iter": 40, "random_state": 0, "n_threads": 1,
                      "rank": 1, "reg_ratio": 0.3},
           "gate": {"challenger": challengers, "challenger_mode": mode},
           "tune": {"budget_seconds": 30, "max_settings": 3, "challenger_settings": 4, **tune}}
    return {"movies": parse_model("movies", raw, "test")}


@pytest.mark.filterwarnings("ignore::solvers.ConvergenceWarning")
def test_knn_is_tuned_gated_published_sparsely_looked_up_and_folded_in(tmp_path, redis_url):
    settings, events = _setup(tmp_path)
    models = _models(["knn"])
    run = retrain.run("movies", models, settings=settings, redis_url=redis_url)
    gate, ch = run["gate"], run["train"]["challenger"]
    assert ch["name"] == "knn" and gate["metric"] in ch["metrics"], ch
    searched = [t for t in ch["tried"] if "params" in t]
    assert 2 <= len(searched) <= item_knn.MAX_SETTINGS
    chosen = ch["tried"][-1]["chosen"]
    assert {"k": chosen["k"], "shrink": chosen["shrink"]} in [t["params"] for t in searched]
    assert run["decision"] == "published" and gate["publishes"] == "challenger-knn", gate
    user = events[0]["user"]
    with TopK(redis_url, namespace=settings.namespace) as topk:
        st = topk.versions.current_state("movies")
        assert st.meta["factor_format"] == "csr" and st.rank == st.n_items
        answer = topk.recommend("movies", user, k=5)
        assert answer.source == "challenger-knn" and len(answer.items) == 5
        mine = [e["item"] for e in events if e["user"] == user][:8]
        folded = topk.fold_in("movies", mine, k=5)
        item, score = answer.items[0]
        why = topk.explain("movies", user, item, k=200)
    assert folded.source != "fallback" and len(folded.items) == 5
    assert not set(mine) & {i for i, _ in folded.items}        # their items are left out
    assert why.method == "item_item" and abs(why.residual) < 1e-4
    assert sum(c["term"] for c in why.contributions) == pytest.approx(score, abs=1e-4)
    # 2% more events: a warm run reuses the last setting (REUSE_GROWTH)
    more = synthetic.rating_events(n_users=6, n_items=150, per_user=30, seed=2, choice=3.0,
                                   start=len(events), id_prefix="more-")
    path = synthetic.write_jsonl(more, settings.home / "in" / "more.jsonl")
    ingest_files([path], "rating", settings=settings, progress=False)
    again = retrain.run("movies", models, settings=settings, redis_url=redis_url, cold=False)
    assert again["train"]["challenger"]["tried"][-1] == {"chosen": chosen,
                                                         "source": "last tuning"}


def test_a_blend_of_dense_and_sparse_factors_publishes_and_answers(tmp_path, redis_url,
                                                                  redis_client):
    """ALS-like dense factors and an item-kNN blended: ``[a U₁, b X]`` against ``[V₁, V_knn]``,
    one CSR pair; served lists (precomputed and on demand) are the blend's top-K, and a new
    user's fold-in is each part's own on its columns, scaled."""
    from scipy.sparse import csr_matrix

    from pipeline.serving.artifact import ModelArtifact
    from pipeline.serving.item_queries import fold_in_method
    from pipeline.serving.publish import publish

    rng = np.random.default_rng(0)
    n_users, n_items = 80, 500
    X = csr_matrix((rng.random((n_users, n_items)) < 0.03).astype(np.float32))
    dense = (rng.normal(size=(n_users, 4)).astype(np.float32),
             rng.normal(size=(n_items, 4)).astype(np.float32), None)
    knn = item_knn.fit(X, 20, 10.0)
    U, V, b = blends.blend(dense, knn, 0.4)
    assert U.shape == (n_users, 4 + n_items) and V.shape == (n_items, 4 + n_items)
    ls = {"method": "least_squares", "reg": 1.0, "alpha": 1.0, "input": "met"}
    spec = blends.blend_fold_in(ls, {"method": "item_item", "input": "met"}, (4, n_items),
                                blends.blend_scales(dense, knn, 0.4))
    art = ModelArtifact.user_item(user_ids=np.arange(n_users), item_ids=np.arange(n_items),
                                  user_factors=U, item_factors=V, item_bias=b, seen=X,
                                  precompute=np.arange(n_users) < 40, fold_in=spec)
    publish("blended", art, redis_client, top_k=20, namespace=f"b{tmp_path.name[-10:]}")
    scores = np.asarray((U @ V.T).todense(), np.float32)
    with TopK(redis_url, namespace=f"b{tmp_path.name[-10:]}") as topk:
        for u in (3, 70):            # precomputed, then scored on demand
            s = scores[u].copy()
            s[X[u].indices] = -np.inf
            want = np.lexsort((np.arange(n_items), -s))[:5].tolist()
            assert [i for i, _ in topk.recommend("blended", u, k=5).items] == want
        st = topk.versions.current_state("blended")
        V_read, b_read = topk.lists.factors(st)
        met = X[5].indices
        u_new = fold_in_method("blend").user_factor(st, V_read, b_read, met,
                                                    np.zeros((0, 2), np.int64), spec)
        a_scale, b_scale = blends.blend_scales(dense, knn, 0.4)
        x = np.zeros(n_items)
        x[met] = 1.0
        np.testing.assert_allclose(u_new[4:], b_scale * x, rtol=1e-6)
        assert len(topk.fold_in("blended", met.tolist(), k=5).items) == 5


@pytest.mark.filterwarnings("ignore::solvers.ConvergenceWarning")
def test_a_run_with_als_and_knn_in_blend_mode_completes_and_serves(tmp_path, redis_url):
    settings, events = _setup(tmp_path)
    run = retrain.run("movies", _models(["als", "knn"], mode="blend"), settings=settings,
                      redis_url=redis_url)
    assert run["decision"] == "published", run["gate"]
    with TopK(redis_url, namespace=settings.namespace) as topk:
        assert len(topk.recommend("movies", events[0]["user"], k=5).items) == 5


@pytest.mark.filterwarnings("ignore::solvers.ConvergenceWarning")
def test_knn_is_skipped_where_ease_fits_every_item_and_runs_where_it_does_not(tmp_path,
                                                                             redis_url):
    settings, _ = _setup(tmp_path)
    run = retrain.run("movies", _models(["ease", "knn"]), settings=settings, publish=False)
    ch = run["train"]["challenger"]
    knn = next(c for c in ch["others"] if c["name"] == "knn")
    assert knn["skipped"] == ("item-kNN skipped: EASE fits every one of the 147 items (the "
                              "ones the events met), the stronger item-item model where it "
                              "fits"), knn
    models = _models(["ease", "knn"], ease_max_items=100)   # EASE on the 68 most met
    run = retrain.run("movies", models, settings=settings, publish=False, cold=True)
    knn = next(c for c in run["train"]["challenger"]["others"] if c["name"] == "knn")
    assert knn.get("skipped") is None and knn["metrics"], knn


@pytest.mark.filterwarnings("ignore::solvers.ConvergenceWarning")
def test_publish_of_a_run_directory_publishes_what_its_gate_chose(tmp_path, redis_url, capsys):
    """Issue 51: `rankstream publish MODEL RUN_DIR` published the run's own model although its
    gate had chosen the challenger, with no --force and no line. It publishes the gate's
    choice and says so; RUN_DIR/artifact is the model itself."""
    from pathlib import Path

    from pipeline.cli import main

    settings, events = _setup(tmp_path)
    run = retrain.run("movies", _models(["knn"]), settings=settings, redis_url=redis_url)
    assert run["gate"]["publishes"] == "challenger-knn"
    run_dir = run["dataset"]["run_dir"]
    again = ["--redis-url", redis_url, "--namespace", f"o{tmp_path.name[-10:]}",
             "--no-progress"]
    assert main(["publish", "movies", run_dir, *again]) == 0
    out = capsys.readouterr().out
    assert f"{run_dir} serves challenger-knn, what its quality gate chose" in out
    with TopK(redis_url, namespace=f"o{tmp_path.name[-10:]}") as topk:
        assert topk.recommend("movies", events[0]["user"], k=3).source == "challenger-knn"
    assert main(["publish", "movies", str(Path(run_dir) / "artifact"), *again]) == 0
    assert "serves" not in capsys.readouterr().out.splitlines()[0]
    with TopK(redis_url, namespace=f"o{tmp_path.name[-10:]}") as topk:
        assert topk.recommend("movies", events[0]["user"], k=3).source == "precomputed"
