"""The ordinal (NPSVOR) family end to end against a real redis-server and the real event store:
reviews -> dataset -> fit (warm-started) -> gate against trivial ratings -> predicted ratings
and the model in Redis -> lookups that rate and rank new items from their text and features."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from pipeline.features import feature_rows
from pipeline.ingest import synthetic
from pipeline.ingest.files import ingest_files
from pipeline.ingest.open_store import open_store
from pipeline.serving.artifact import ModelArtifact
from pipeline.serving.lookup import TopK
from pipeline.settings import Settings
from pipeline.training import datasets, retrain
from pipeline.training.config import parse_model
from pipeline.training.registry import family
from pipeline.training.trainers.npsvor_data import ordinal
from solvers import NPSVOR
from solvers.persist import read_bundle

TEXT_FEATURES = 2**18
PARAMS = {"C1": 1.0, "tol": 0.01, "random_state": 0, "n_threads": 1,
          "text_features": TEXT_FEATURES}


def _models(**spec):
    base = {"algorithm": "npsvor", "kinds": ["ordinal"], "params": dict(PARAMS),
            "gate": {"tolerance": 0.02}}
    return {"reviews": parse_model("reviews", {**base, **spec}, "test")}


@pytest.fixture
def settings(tmp_path, redis_client):
    return Settings(home=tmp_path / "home", namespace=f"t{tmp_path.name[-12:]}")


def _ingest(events, settings, name):
    path = synthetic.write_jsonl(events, settings.home / "in" / f"{name}.jsonl")
    return ingest_files([path], "ordinal", settings=settings, progress=False)


def _dataset(run: dict) -> dict:
    return read_bundle(f"{run['dataset']['run_dir']}/dataset", fmt="rankstream.dataset")[1]


def _refit(arrays: dict, **params) -> NPSVOR:
    """The model the run trained, fitted again in this process from its dataset bundle."""
    from scipy.sparse import csr_matrix

    X = csr_matrix((arrays["X_data"], arrays["X_indices"], arrays["X_indptr"]),
                   shape=tuple(arrays["X_shape"]))
    train = ~arrays["test_mask"]
    est = family("npsvor").estimator_params(params)
    return NPSVOR(**est).fit(X[train], arrays["y"][train], ids=arrays["ids"][train])


def _rows(events, n_features):
    """Training/serving rows of events, as pipeline.features builds them."""
    idx = [None if "features" not in e else [int(k) for k in e["features"]] for e in events]
    val = [None if "features" not in e else list(e["features"].values()) for e in events]
    return feature_rows(idx, val, n_features, [e.get("text") for e in events],
                        TEXT_FEATURES)[0]


# ------------------------------------------------------------------------------ the family


def test_trained_model_beats_every_trivial_rating_and_lookups_agree_with_it(settings,
                                                                           redis_url):
    events = synthetic.ordinal_events(n_items=300, n_reviews=3000, seed=1)
    unseen = synthetic.ordinal_events(n_items=300, n_reviews=40, seed=2, id_prefix="new")
    _ingest(events, settings, "r0")
    run = retrain.run("reviews", _models(), settings=settings, redis_url=redis_url)
    assert run["decision"] == "published", run.get("reason")
    metrics, baselines = run["train"]["metrics"], run["train"]["baselines"]
    assert set(metrics) == {"mae", "mse", "accuracy", "rating_ndcg"}
    assert set(baselines) == {"majority", "mean", "median", "best_feature"}
    for name, trivial in baselines.items():   # by a wide margin on planted structure
        assert metrics["mae"] < trivial["mae"] - 0.2, (name, metrics, trivial)
        assert metrics["accuracy"] > trivial["accuracy"]
        assert metrics["rating_ndcg"] > trivial["rating_ndcg"]
    assert run["gate"]["lift_over_trivial"]["best_feature"] > 0.2
    best = baselines["best_feature"]   # a numeric feature or one hashed n-gram, named
    assert best["column"] in (f"feature {best['feature']}",
                              f"hashed text column {best['feature'] - 4}")

    arrays = _dataset(run)
    model = _refit(arrays, **PARAMS)   # n_threads=1, random_state=0: the same fit, bit for bit
    X = _rows(unseen, int(arrays["n_features"]))
    with TopK(redis_url, namespace=settings.namespace) as topk:
        rated = [topk.predict_rating("reviews", features=e["features"], text=e["text"])
                 for e in unseen]
        ranked = topk.rank("reviews", [(e["event_id"], {"features": e["features"],
                                                        "text": e["text"]}) for e in unseen],
                           k=len(unseen))
        published = topk.recommend("reviews", None, k=1000)
    assert [p.rating for p in rated] == model.predict(X).tolist()
    np.testing.assert_allclose([p.score for p in rated], model.predict_score(X), rtol=1e-5)
    order = np.argsort(-model.predict_score(X), kind="stable")
    assert [i for i, _ in ranked.items] == [unseen[i]["event_id"] for i in order]
    assert ranked.source == "scored" and ranked.version == published.version == 1
    # the held-out reviews' ratings are predicted as well from the lookup as in the run
    assert np.mean(np.abs(np.array([p.rating for p in rated])
                          - [e["label"] for e in unseen])) < 0.5

    # published: every item's rating and score are the prediction for its latest review
    latest = {e["item"]: e for e in events}
    # k = 1000 asks past the stored top_k (100): every item, ranked by the published scores
    assert len(published.items) == len(latest)
    items = [i for i, _ in published.items]
    X_items = _rows([latest[i] for i in items], int(arrays["n_features"]))
    np.testing.assert_allclose([s for _, s in published.items], model.predict_score(X_items),
                               rtol=1e-5)
    artifact = ModelArtifact.load(f"{run['publish']['checkpoint']}/artifact")
    by_item = dict(zip(artifact.item_ids.tolist(), artifact.item_scores.tolist()))
    assert sorted(by_item) == sorted(latest)    # every item of the window has its rating
    assert [by_item[i] for i in items] == model.predict(X_items).tolist()


def test_warm_retrain_after_2pct_new_events_reuses_the_duals(settings, redis_url):
    events = synthetic.ordinal_events(n_items=400, n_reviews=5000, seed=3)
    cut, nxt = int(0.9 * len(events)), int(0.92 * len(events))
    _ingest(events[:cut], settings, "r0")
    models = _models()
    first = retrain.run("reviews", models, settings=settings, redis_url=redis_url)
    assert first["decision"] == "published" and not first["train"]["warm_start"]
    _ingest(events[cut:nxt], settings, "r1")
    warm = retrain.run("reviews", models, settings=settings, redis_url=redis_url)
    cold = retrain.run("reviews", models, settings=settings, redis_url=redis_url, cold=True,
                       publish=False)
    w, c = warm["train"], cold["train"]
    assert w["warm_start"] and not c["warm_start"]
    assert w["converged"] and c["converged"]
    assert sum(w["n_iter_per_rank"]) < 0.6 * sum(c["n_iter_per_rank"]), (w, c)
    assert abs(w["metrics"]["mae"] - c["metrics"]["mae"]) <= 0.02
    assert warm["decision"] == "published" and warm["publish"]["version"] == 2

    # instance ids are the events': the first run's rows keep their ids and their side
    a, b = _dataset(first), _dataset(warm)
    assert np.isin(a["ids"], b["ids"]).all() and len(b["ids"]) == nxt
    side = dict(zip(b["ids"].tolist(), b["test_mask"].tolist()))
    assert [side[i] for i in a["ids"].tolist()] == a["test_mask"].tolist()


def test_tuned_C_and_loss_are_served_and_kept_by_a_warm_run(settings, redis_url):
    from pipeline.cli.train import _fit_lines
    from pipeline.training.report import write_report

    events = synthetic.ordinal_events(n_items=300, n_reviews=3000, seed=5)
    cut = int(0.95 * len(events))
    _ingest(events[:cut], settings, "r0")
    models = _models(tune={"max_settings": 4})
    first = retrain.run("reviews", models, settings=settings, redis_url=redis_url)
    tr, tuning = first["train"], first["train"]["tuning"]
    assert first["decision"] == "published", first.get("reason")
    assert tuning["source"] == "tuned" and 1 <= len(tuning["tried"]) <= 4
    assert (tr["C1"], tr["loss"]) == (tuning["choice"]["C1"], tuning["choice"]["loss"])
    assert any(line.startswith("  tuned    C1=") for line in _fit_lines(tr))
    page = write_report(Path(first["dataset"]["run_dir"])).read_text()
    assert "model: tuner" in page and page.count("<td>chosen</td>") == 1

    # the lookups answer with the tuned model
    arrays = _dataset(first)
    model = _refit(arrays, **{**PARAMS, **tuning["choice"]})
    unseen = events[cut:cut + 30]
    X = _rows(unseen, int(arrays["n_features"]))
    with TopK(redis_url, namespace=settings.namespace) as topk:
        rated = [topk.predict_rating("reviews", features=e["features"], text=e["text"])
                 for e in unseen]
    assert [p.rating for p in rated] == model.predict(X).tolist()

    # 5% more events: the warm run keeps the choice and fits once, from the last duals
    _ingest(events[cut:], settings, "r1")
    warm = retrain.run("reviews", models, settings=settings, redis_url=redis_url)
    assert warm["decision"] == "published" and warm["train"]["warm_start"]
    assert warm["train"]["tuning"]["source"] == "last tuning"
    assert warm["train"]["tuning"]["choice"] == tuning["choice"]
    assert any("the last run's choice" in line for line in _fit_lines(warm["train"]))


def test_gate_refuses_a_model_no_better_than_a_constant_rating(settings, redis_url):
    rng = np.random.default_rng(4)
    events = synthetic.ordinal_events(n_items=200, n_reviews=1500, seed=4)
    more = synthetic.ordinal_events(n_items=200, n_reviews=300, seed=5)
    for e in events + more:   # ratings unrelated to the text and features
        e["label"] = int(rng.choice([1, 2, 3, 3, 3, 4, 5]))
    _ingest(events, settings, "noise")
    # nothing is served yet: the best trivial list is published (marked) rather than nothing;
    # the model must lead by 0.05 MAE, and its lift's interval over the held-out events says
    # it does not (a shortfall outside the noise)
    margin = {"tolerance": 0.02, "trivial_margin": 0.05}
    run = retrain.run("reviews", _models(gate=margin), settings=settings, redis_url=redis_url)
    lift = run["train"]["holdout_intervals"]["lift"]["model"]["interval"]
    assert run["train"]["holdout_intervals"]["unit"] == "events" and lift[1] < 0.05
    assert run["decision"] == "published" and run["gate"]["publishes"].startswith("trivial-")
    assert "does not beat the trivial" in run["reason"] and "nothing is served" in run["reason"]
    with TopK(redis_url, namespace=settings.namespace) as topk:
        served = topk.recommend("reviews", None, k=3)
    assert served.version == 1 and len(served.items) == 3 and served.source == "trivial"
    # once something is served, if_trivial = "reject" keeps its meaning
    _ingest(more, settings, "noise-2")
    run = retrain.run("reviews", _models(gate=margin), settings=settings, redis_url=redis_url)
    assert run["decision"] == "rejected", run["reason"]
    assert "does not beat the trivial" in run["reason"]
    # if_trivial = "publish_trivial": the best trivial model's ratings are served instead
    models = _models(gate={**margin, "if_trivial": "publish_trivial"})
    run = retrain.run("reviews", models, settings=settings, redis_url=redis_url, cold=True)
    assert run["decision"] == "published" and run["gate"]["publishes"].startswith("trivial-")
    with TopK(redis_url, namespace=settings.namespace) as topk:
        served = topk.recommend("reviews", None, k=3)
    assert served.version == 2 and len(served.items) == 3 and served.source == "trivial"


def test_features_only_and_text_only_reviews_train(settings, redis_url):
    events = synthetic.ordinal_events(n_items=300, n_reviews=2000, seed=5, text=False)
    _ingest(events, settings, "features")
    run = retrain.run("reviews", _models(params={**PARAMS, "text_features": 0}),
                      settings=settings, redis_url=redis_url)
    trivial = run["train"]["baselines"]
    assert run["decision"] == "published", run.get("reason")
    # the rating scatters around the item's quality: two noisy views of it beat the best one
    assert run["train"]["metrics"]["mae"] < trivial["best_feature"]["mae"]
    assert run["train"]["metrics"]["mae"] < trivial["median"]["mae"] - 0.2
    assert run["dataset"]["stats"]["with_text"] == 0

    texts = synthetic.ordinal_events(n_items=300, n_reviews=2000, seed=6, features=False,
                                     start=2000, id_prefix="t")    # after the others
    _ingest(texts, settings, "texts")
    # and the squared losses (the authors' -m 2) train and publish through the same path
    both = retrain.run("reviews", _models(window={"last_events": 2000},
                                          params={**PARAMS, "loss": "squared_hinge"}),
                       settings=settings, redis_url=redis_url, cold=True)
    stats = both["dataset"]["stats"]
    assert stats["with_features"] == 0 and stats["with_text"] == 2000
    assert both["decision"] == "published", both.get("reason")
    with TopK(redis_url, namespace=settings.namespace) as topk:
        assert topk.predict_rating("reviews", text="excellent superb love").rating >= 4


# ------------------------------------------------------------------------------ the dataset


def test_dataset_rows_are_events_with_stable_ids_and_the_serving_layout(tmp_path):
    settings = Settings(home=tmp_path)
    events = synthetic.ordinal_events(n_items=30, n_reviews=200, seed=7)
    events.append({**events[5], "retry": 1})    # re-sent (a field the kind ignores): once
    events.append({"event_id": "wide", "ts": events[-1]["ts"] + 1, "item": "p-wide",
                   "label": 3, "features": {"2": 1.0, "70": 5.0}})   # index 70 >= max_features
    _ingest(events, settings, "e")
    data = ordinal(open_store(settings), max_features=10,
                            text_features=2**12)
    assert data.stats["reviews"] == 201 and data.stats["resent"] == 1
    assert data.stats["feature_values_over_max_features"] == 1 and data.n_features == 10
    assert data.X.shape == (201, 10 + 2**12)
    assert len(set(data.ids.tolist())) == 201
    kept = events[:5] + events[6:]      # the later copy of a re-sent event is the one kept
    np.testing.assert_array_equal(data.ids, datasets.event_ids([e["event_id"] for e in kept]))
    # the rows are what a lookup builds from the same events
    idx = [[int(k) for k in e.get("features", {})] for e in kept]
    val = [list(e.get("features", {}).values()) for e in kept]
    expected, dropped = feature_rows(idx, val, 10, [e.get("text") for e in kept], 2**12)
    assert dropped == 1 and (data.X != expected).nnz == 0
    # an item's published row is its latest event
    latest = {}
    for n in sorted(range(len(kept)), key=lambda n: (kept[n]["ts"], n)):   # by time
        latest[kept[n]["item"]] = n
    assert dict(zip(data.item_ids[data.row_item[data.latest]].tolist(),
                    data.latest.tolist())) == latest
    # the width never shrinks below the previous run's, and the split is by event id
    again = ordinal(open_store(settings), n_features=12,
                             max_features=100, text_features=0)
    assert again.n_features == 71 and again.X.shape[1] == 71
    assert "text is ignored" in again.stats["warning"]
    wider = ordinal(open_store(settings), n_features=90,
                             max_features=100, text_features=0)
    assert wider.n_features == 90
    np.testing.assert_array_equal(again.test_mask, datasets.stable_split(again.ids, 0.2, 0))


# ------------------------------------------------------------------------------ errors


def test_errors_name_expected_and_actual(settings, redis_url, tmp_path):
    events = synthetic.ordinal_events(n_items=50, n_reviews=400, seed=8)
    for e in events:
        if e["label"] == 3:
            e["label"] = 4       # no 3-star review: ranks are not consecutive
    bad = [{"event_id": "b1", "ts": 1_700_000_000_001, "item": "x", "label": 0, "text": "fine"},
           {"event_id": "b2", "ts": 1_700_000_000_002, "item": "x", "label": 2}]
    summary = _ingest(events + bad, settings, "holes")
    reasons = open_store(settings).read_dead_letters().column("reason").to_pylist()
    assert sum(summary.dead_letters.values()) == 2
    assert any("label" in r and "0" in r for r in reasons), reasons
    assert any("needs 'features' or 'text'" in r for r in reasons), reasons
    with pytest.raises(ValueError, match=r"3 is missing: rank 3 has no instance"):
        retrain.run("reviews", _models(), settings=settings, redis_url=redis_url)
    with pytest.raises(ValueError, match=r"metric is 'ndcg@10', expected one of \['mae'"):
        _models(evaluation={"metric": "ndcg@10"})
    with pytest.raises(ValueError, match=r"kinds \['rating'\], expected a non-empty subset "
                                         r"of \['ordinal'\]"):
        _models(kinds=["rating"])


def test_demo_reads_a_reviews_file_and_names_a_bad_line(tmp_path):
    from pipeline.cli.demo import _read_reviews

    path = tmp_path / "reviews.tsv"
    path.write_text("m1\t4\ta fine film\twith a tab\n\nm2\t1\tawful\n")
    events = _read_reviews(path)
    assert [(e["item"], e["label"], e["text"]) for e in events] == [
        ("m1", 4, "a fine film\twith a tab"), ("m2", 1, "awful")]
    assert events[0]["ts"] < events[1]["ts"] and events[0]["event_id"] != events[1]["event_id"]
    path.write_text("m1\t4\tfine\nm2\tfive\tgreat\n")
    with pytest.raises(SystemExit, match=r"reviews.tsv:2: rating is 'five', expected an "
                                         r"integer >= 1"):
        _read_reviews(path)
    path.write_text("m1 4 fine\n")
    with pytest.raises(SystemExit, match=r":1: 1 tab-separated fields, expected 3"):
        _read_reviews(path)
