"""The query ranker end to end: judgment events in the real event store -> per-query dataset ->
KernelRankSVM trainer -> gate -> query_docs + support set in a real redis-server -> lookups."""

from __future__ import annotations

import numpy as np
import pytest

from pipeline.ingest import synthetic
from pipeline.ingest.files import ingest_files
from pipeline.ingest.local_store import LocalEventStore
from pipeline.serving.lookup import TopK
from pipeline.serving.publish import publish
from pipeline.settings import Settings
from pipeline.training import retrain
from pipeline.training.config import parse_model
from pipeline.training.idmap import IdMap
from pipeline.training.trainers.kernel_ranksvm import instance_ids, judgments
from solvers.persist import read_bundle


def _models(**params):
    spec = {"algorithm": "kernel_ranksvm", "kinds": ["judgment"],
            "params": {"n_threads": 1}, "gate": {"tolerance": 0.02}}
    specs = {"search": spec,
             "search_linear": {**spec, "params": {"kernel": "linear", "n_threads": 1}}}
    for name, extra in params.items():
        specs[name] = {**specs[name], **extra}
    return {name: parse_model(name, s, "test") for name, s in specs.items()}


@pytest.fixture
def settings(tmp_path):
    return Settings(home=tmp_path / "home", namespace=f"q{tmp_path.name[-12:]}")


def _ingest(events, settings, name):
    path = synthetic.write_jsonl(events, settings.home / "in" / f"{name}.jsonl")
    ingest_files([path], "judgment", settings=settings, progress=False)


def _judgments(n_queries=150, seed=0):
    events = synthetic.judgment_events(n_queries=n_queries, docs_per_query=15, seed=seed)
    cut = int(len(events) * 0.9)
    return events[:cut], events[cut:cut + int(len(events) * 0.02)]


def _dataset(run: dict) -> dict:
    return read_bundle(f"{run['dataset']['run_dir']}/dataset", fmt="rankstream.dataset")[1]


# ---------------------------------------------------------------------------------- dataset


def test_synthetic_judgments_are_deterministic_and_graded():
    a = synthetic.judgment_events(n_queries=20, docs_per_query=6, seed=3)
    assert a == synthetic.judgment_events(n_queries=20, docs_per_query=6, seed=3)
    assert a != synthetic.judgment_events(n_queries=20, docs_per_query=6, seed=4)
    assert {e["label"] for e in a} == {0, 1, 2}
    pairs = {(e["query"], e["doc"]) for e in a}
    assert len(pairs) == len(a), "a doc is judged twice for one query"


def test_latest_judgment_wins_ids_stay_and_whole_queries_are_held_out(settings):
    def event(n, query, doc, label, features):
        return {"event_id": f"e{n}", "ts": synthetic.BASE_TS + n, "query": query, "doc": doc,
                "label": label, "features": features}

    first = [event(0, "q1", "a", 0, [0.1, 0.2]), event(1, "q1", "b", 2, {"1": 0.5}),
             event(2, "q2", "a", 1, [1.0]),                       # a query with one doc
             event(3, "q3", "c", 1, [0.3, 0.3]), event(4, "q3", "d", 1, [0.0, 0.9])]  # one level
    _ingest(first, settings, "j0")
    store = LocalEventStore(settings.store_dir)
    one = judgments(store, test_fraction=0.0)
    assert one.stats["judgments"] == 5 and one.stats["replaced"] == 0
    assert one.stats["train_queries_with_pairs"] == 1
    assert one.X.shape == (5, 2)
    # the window counts its queries by their name, as a user reads it
    assert one.window.describe()["queries"] == 3 and "querys" not in str(one.window.describe())

    # q1/a re-judged later (label 0 -> 2, new features) and a new feature index: latest wins
    _ingest([event(10, "q1", "a", 2, {"4": 1.5}), event(11, "q4", "e", 0, [0.5])], settings,
            "j1")
    two = judgments(store, queries=one.queries, docs=one.docs, test_fraction=0.0,
                             n_features=one.X.shape[1])
    assert two.stats["judgments"] == 6 and two.stats["replaced"] == 1
    row = np.flatnonzero(two.instance == instance_ids(
        two.queries.lookup(["q1"]), two.docs.lookup(["a"])))
    assert row.size == 1 and two.label[row[0]] == 2
    assert two.X[row[0]].toarray().ravel().tolist() == [0, 0, 0, 0, 1.5]
    # ids of the first build keep their index, so instance ids (β's keys) are unchanged
    assert (two.queries.ids[:len(one.queries)] == one.queries.ids).all()
    assert set(one.instance) <= set(two.instance)

    # the holdout takes whole queries, the same ones on every build
    many = synthetic.judgment_events(n_queries=100, docs_per_query=5, seed=1)
    _ingest(many, settings, "j2")
    split = [judgments(store, queries=IdMap(), docs=IdMap(), test_fraction=0.3, seed=0)
             for _ in range(2)]
    q, test = split[0].query, split[0].test_mask
    assert not set(q[test]) & set(q[~test]), "a query is on both sides"
    assert 0.15 < np.unique(q[test]).size / np.unique(q).size < 0.45
    assert (split[1].test_mask == test).all()


# ---------------------------------------------------------------------------------- training


def test_kernel_model_beats_linear_and_best_feature_and_warm_retrain_reuses_beta(settings,
                                                                                 redis_url):
    first, fresh = _judgments()
    _ingest(first, settings, "j0")
    models = _models()
    run = retrain.run("search", models, settings=settings, redis_url=redis_url)
    linear = retrain.run("search_linear", models, settings=settings, publish=False)
    assert run["decision"] == "published", run.get("reason")
    metrics, gate = run["train"]["metrics"], run["gate"]
    best = run["train"]["baselines"]["best_feature"]
    # the planted relevance is x2 − 2|x0 − x1|: the best single feature is x2, upward
    assert (best["feature"], best["sign"]) == (2, 1)
    assert metrics["ndcg@10"] > linear["train"]["metrics"]["ndcg@10"] + 0.05
    assert metrics["ndcg@10"] > best["ndcg@10"] + 0.05
    assert gate["trivial"] == {"best_feature": best["ndcg@10"]}
    assert gate["lift_over_trivial"]["best_feature"] > 0.05
    assert set(metrics) == {"ndcg@10", "ndcg_relevant@10", "map", "pairwise_accuracy"}
    assert metrics["ndcg_relevant@10"] >= metrics["ndcg@10"]

    _ingest(fresh, settings, "j1")
    warm = retrain.run("search", models, settings=settings, redis_url=redis_url)
    cold = retrain.run("search", models, settings=settings, redis_url=redis_url, cold=True,
                       publish=False)
    assert warm["train"]["warm_start"] and not cold["train"]["warm_start"]
    assert warm["train"]["n_iter"] < cold["train"]["n_iter"]
    # the same stopping rule (measured from β = 0): as good as the cold fit
    assert warm["train"]["objective"] <= cold["train"]["objective"] * (1 + 1e-3)
    assert abs(warm["train"]["metrics"]["ndcg@10"] - cold["train"]["metrics"]["ndcg@10"]) < 0.01
    assert warm["decision"] == "published" and warm["publish"]["version"] == 2
    ids1, ids2 = _dataset(run)["instance"], _dataset(warm)["instance"]
    assert np.isin(ids1, ids2).all(), "instance ids of the first run changed"


def test_gate_refuses_a_model_no_better_than_the_best_feature(settings, redis_url):
    first, _ = _judgments(n_queries=80)
    _ingest(first, settings, "j0")
    strict = {"gate": {"trivial_margin": 0.5}}
    # nothing served yet: the best feature's ranking is published (marked) rather than nothing
    served = retrain.run("search", _models(search=strict), settings=settings,
                         redis_url=redis_url)
    assert served["decision"] == "published", served["reason"]
    assert "does not beat the trivial best_feature" in served["reason"]
    query = first[0]["query"]
    rows = [e for e in first if e["query"] == query]
    by_feature = sorted(rows, key=lambda e: -e["features"][2])   # best feature x2, upward
    with TopK(redis_url, namespace=settings.namespace) as topk:
        rec = topk.recommend("search", query, k=len(rows))
    assert rec.source == "trivial"
    assert [d for d, _ in rec.items] == [e["doc"] for e in by_feature]
    # once something is served, the default if_trivial = "reject" refuses
    refused = retrain.run("search", _models(search=strict), settings=settings,
                          redis_url=redis_url, cold=True)
    assert refused["decision"] == "rejected"
    assert "does not beat the trivial best_feature" in refused["reason"]


def test_no_training_query_with_a_pair_is_a_clear_error(settings, redis_url):
    flat = [{**e, "label": 1} for e in _judgments(n_queries=20)[0]]
    _ingest(flat, settings, "j0")
    with pytest.raises(ValueError, match="no query of the training split has two docs"):
        retrain.run("search", _models(), settings=settings, redis_url=redis_url)


# ---------------------------------------------------------------------------------- serving


def test_published_lists_and_scored_candidates_match_the_model_in_process(settings, redis_url,
                                                                          redis_client):
    first, _ = _judgments(n_queries=60)
    _ingest(first, settings, "j0")
    cfg = _models()["search"]
    trainer = cfg.family.new_trainer()
    arrays, _ = trainer.build(LocalEventStore(settings.store_dir), cfg, None)
    fitted, _ = trainer.fit(arrays, cfg, None)
    model = fitted.model
    publish("search", trainer.artifact(model, arrays, cfg), redis_client, top_k=20,
            namespace=settings.namespace)

    # features straight from the events (not from the dataset), in the dataset's row order
    features = dict(zip(instance_ids(*_indices(arrays, first)).tolist(),
                        (e["features"] for e in first)))
    X = np.array([features[i] for i in arrays["instance"].tolist()])
    scores = model.decision_function(X)
    query_ids, doc_ids = arrays["query_ids"], arrays["doc_ids"]
    with TopK(redis_url, namespace=settings.namespace) as topk:
        for qi in np.unique(arrays["query"])[:10]:
            rows = np.flatnonzero(arrays["query"] == qi)
            # in process: the query's docs by decreasing float32 score (publish's tie order)
            s32 = scores[rows].astype(np.float32)
            order = rows[np.lexsort((arrays["doc"][rows], -s32))]
            rec = topk.recommend("search", query_ids[qi], k=20)
            assert rec.source == "precomputed"
            assert [d for d, _ in rec.items] == doc_ids[arrays["doc"][order]].tolist()
            np.testing.assert_allclose([s for _, s in rec.items], scores[order], rtol=1e-5,
                                       atol=1e-5)
            # re-ranking candidates given in the request: dense lists and sparse maps
            candidates = [(str(doc_ids[arrays["doc"][r]]), X[r].tolist() if r % 2 else
                           {str(j): v for j, v in enumerate(X[r].tolist()) if v != 0})
                          for r in rows]
            ranked = topk.rank("search", candidates, k=len(rows), query=query_ids[qi])
            assert ranked.source == "scored" and ranked.user == query_ids[qi]
            got = dict(ranked.items)
            np.testing.assert_allclose([got[c] for c, _ in candidates], scores[rows],
                                       rtol=1e-5, atol=1e-5)
            assert [d for d, _ in ranked.items] == [candidates[i][0] for i in
                                                    np.argsort(-scores[rows], kind="stable")]
        unknown = topk.recommend("search", "a query never judged", k=5)
    assert unknown.source == "fallback" and len(unknown.items) == 5


def _indices(arrays, events):
    """(query index, doc index) of each event, through the dataset's id maps."""
    return (IdMap(arrays["query_ids"]).lookup([e["query"] for e in events]),
            IdMap(arrays["doc_ids"]).lookup([e["doc"] for e in events]))
