"""On-demand scorers: the published model scores candidates given in a request as the trained
estimator does (float32 weights: agreement to float32 precision), travels without pickle, and
answers through TopK with one round trip once cached, or from the cache when Redis is down."""

from __future__ import annotations

import numpy as np
import pytest
import scipy.sparse as sp

from pipeline.features import feature_rows
from pipeline.serving.artifact import ModelArtifact
from pipeline.serving.embedded_redis import EmbeddedRedis
from pipeline.serving.layout import LayoutError
from pipeline.serving.lookup import RedisUnavailable, TopK
from pipeline.serving.publish import publish
from pipeline.serving.scorers import Scorer
from solvers import NPSVOR, KernelRankSVM

WORDS = {1: "awful dull boring", 2: "weak flat", 3: "fine decent", 4: "good fun",
         5: "superb brilliant moving"}


@pytest.fixture(scope="module")
def reviews():
    """Ordinal rows from 3 features and a text whose words depend on the rating."""
    rng = np.random.default_rng(0)
    n = 400
    y = rng.integers(1, 6, n)
    features = rng.normal(size=(n, 3)) + (y[:, None] - 3) * [0.6, 0.0, -0.3]
    texts = [" ".join(rng.choice(WORDS[r].split(), 2)) + " the film" for r in y]
    indices = [list(range(3))] * n
    X, _ = feature_rows(indices, features.tolist(), 3, texts, 2**12)
    model = NPSVOR(C1=1.0, random_state=0, n_threads=1).fit(X, y)
    return model, features, texts, X


@pytest.fixture(scope="module")
def ranker():
    rng = np.random.default_rng(1)
    X = rng.normal(size=(200, 4))
    y = (np.abs(X[:, 0] - X[:, 1]) < 0.7).astype(int) + (X[:, 2] > 0.5)
    model = KernelRankSVM(C=1.0, gamma=0.5, random_state=0, n_threads=1)
    return model.fit(X, y, np.repeat(np.arange(20), 10)), X


def test_ordinal_scorer_matches_the_estimator_and_keeps_only_used_columns(reviews):
    model, features, texts, X = reviews
    scorer = Scorer.from_bytes(Scorer.ordinal(model, 3, 2**12).to_bytes(), "test")
    assert scorer.arrays["coef"].dtype == np.float32
    assert 3 < scorer.arrays["columns"].size < 200     # 3 features + the texts' n-grams
    rows = scorer.rows([{"features": f, "text": t} for f, t in zip(features.tolist(), texts)])
    assert abs(rows - X).max() == 0                    # serving builds the training rows
    assert (scorer.predict_rating(rows) == model.predict(X)).mean() > 0.99
    np.testing.assert_allclose(scorer.score(rows), model.predict_score(X), atol=1e-4)


def test_kernel_scorer_matches_decision_function(ranker):
    model, X = ranker
    scorer = Scorer.from_bytes(Scorer.kernel(model).to_bytes(), "test")
    assert scorer.arrays["support_vectors"].shape[0] == model.support_vectors_.shape[0]
    rows = scorer.rows([{str(j): v for j, v in enumerate(x)} for x in X[:30].tolist()])
    np.testing.assert_allclose(scorer.score(rows), model.decision_function(X[:30]),
                               rtol=1e-4, atol=1e-4)


def test_dense_list_candidates_take_one_conversion_and_give_the_same_rows(ranker):
    model, X = ranker
    scorer = Scorer.kernel(model)
    maps = scorer.rows([{str(j): v for j, v in enumerate(x)} for x in X[:30].tolist()])
    assert scorer._dense_rows(X[:30].tolist()) is not None
    dense = scorer.rows(X[:30].tolist())
    assert dense.shape == maps.shape and abs(dense - maps).max() == 0
    short = scorer.rows([x[:2] for x in X[:5].tolist()])          # padded to n_features
    assert short.shape == (5, 4) and abs(short[:, 2:]).max() == 0
    # anything else goes candidate by candidate, with the same answers and errors
    for odd in ([X[0].tolist(), X[1, :3].tolist()], [X[0].tolist(), {"0": 1.0}],
                [[1.0, float("nan")]], [[1.0] * 5]):
        assert scorer._dense_rows(odd) is None
    np.testing.assert_array_equal(scorer.rows([X[0].tolist(), X[1, :3].tolist()]).toarray(),
                                  np.vstack([X[0], np.r_[X[1, :3], 0.0]]).astype(np.float32))
    with pytest.raises(ValueError, match="candidate 0: features: value at position 1 is nan"):
        scorer.rows([[1.0, float("nan")]])


def test_a_scorer_names_its_estimator_and_one_published_without_it_still_rebuilds(ranker):
    model, X = ranker
    scorer = Scorer.of(model)
    assert (scorer.kind, scorer.params["estimator"]) == ("kernel",
                                                          "solvers.kernel_ranksvm:KernelRankSVM")
    older = Scorer(scorer.kind, {k: v for k, v in scorer.params.items() if k != "estimator"},
                   scorer.arrays)        # as published before scorers named their estimator
    rows = scorer.rows(X[:5].tolist())
    np.testing.assert_array_equal(older.score(rows), scorer.score(rows))
    with pytest.raises(ValueError, match="scorer kind is 'magic', expected one of"):
        Scorer("magic", {"n_features": 1}, {})
    with pytest.raises(ValueError, match="'no.such.module:Kind' cannot be imported"):
        Scorer("no.such.module:Kind", {"n_features": 1}, {})
    with pytest.raises(ValueError, match="is not a ScorerKind"):
        Scorer("solvers:NPSVOR", {"n_features": 1}, {})
    with pytest.raises(ValueError, match="a kernel scorer predicts no rating"):
        scorer.predict_rating(rows)


def test_bad_candidates_and_bytes_are_named(reviews, ranker):
    model, *_ = reviews
    ordinal = Scorer.ordinal(model, 3, 2**12)
    with pytest.raises(ValueError, match="candidate 1: features: index 7 > 2, the model.s "
                                         "highest feature index$"):
        ordinal.rows([[1.0, 2.0, 3.0], {"7": 1.0}])
    with pytest.raises(ValueError, match="candidate 0 has text; this model takes no text"):
        Scorer.kernel(ranker[0]).rows(["a text"])
    with pytest.raises(LayoutError, match="k:scorer does not hold a scorer"):
        Scorer.from_bytes(b"not an npz", "k:scorer")
    with pytest.raises(ValueError, match="the model has 4099 features, n_features \\+ "
                                         "text_features is 4100"):
        Scorer.ordinal(model, 4, 2**12)


def test_artifact_keeps_its_scorer_through_save_and_load(reviews, tmp_path):
    model, _, _, X = reviews
    art = ModelArtifact.predicted_ratings(
        item_ids=np.arange(X.shape[0]), ratings=model.predict(X), scores=model.predict_score(X),
        scorer=Scorer.ordinal(model, 3, 2**12))
    back = ModelArtifact.load(art.save(tmp_path / "a"))
    assert back.scorer.kind == "ordinal_linear"
    np.testing.assert_array_equal(back.scorer.arrays["coef"], art.scorer.arrays["coef"])


def test_lookups_rate_and_rank_candidates_from_the_published_model(redis_client, redis_url,
                                                                   reviews, ranker):
    model, features, texts, X = reviews
    scores = model.predict_score(X)
    publish("reviews", ModelArtifact.predicted_ratings(
        item_ids=np.arange(X.shape[0]), ratings=model.predict(X), scores=scores,
        scorer=Scorer.ordinal(model, 3, 2**12)), redis_client, top_k=20)
    kmodel, KX = ranker
    q_scores = kmodel.decision_function(KX)
    publish("search", ModelArtifact.query_docs(
        query_ids=["q"], doc_ids=[f"d{i}" for i in range(10)], indptr=[0, 10],
        docs=np.arange(10), scores=q_scores[:10], scorer=Scorer.kernel(kmodel)),
        redis_client, top_k=10)
    publish("plain", ModelArtifact.global_list(item_ids=[1, 2], scores=[0.1, 0.2]),
            redis_client)
    with TopK(redis_url, timeout=2.0) as topk:
        best = topk.recommend("reviews", None, k=5)
        assert [i for i, _ in best.items] == np.argsort(-scores, kind="stable")[:5].tolist()
        for i in (0, 7, 99):
            p = topk.predict_rating("reviews", features=features[i].tolist(), text=texts[i])
            assert p.rating == model.predict(X[i])[0] and p.version == 1
            assert p.score == pytest.approx(scores[i], abs=1e-4)
        rec = topk.rank("reviews", [(f"i{i}", {"features": features[i].tolist(),
                                               "text": texts[i]}) for i in range(50)], k=10)
        assert rec.source == "scored" and rec.version == 1
        assert [c for c, _ in rec.items] == [f"i{i}" for i in
                                             np.argsort(-scores[:50], kind="stable")[:10]]
        cands = [(f"d{i}", KX[i].tolist()) for i in range(30, 60)]
        rec = topk.rank("search", cands, k=30, query="new query")
        got = dict(rec.items)
        np.testing.assert_allclose([got[f"d{i}"] for i in range(30, 60)], q_scores[30:60],
                                   rtol=1e-4, atol=1e-4)
        assert rec.user == "new query"
        assert [d for d, _ in topk.recommend("search", "q", k=3).items] == \
            [f"d{i}" for i in np.argsort(-q_scores[:10], kind="stable")[:3]]
        with pytest.raises(LayoutError, match="has no scorer"):
            topk.rank("plain", [("a", [1.0])])
        with pytest.raises(ValueError, match="predict_rating needs features or text"):
            topk.predict_rating("reviews")
        assert topk.stats()["reviews"]["scored"] == 1


def test_cached_model_answers_while_redis_is_down(tmp_path, reviews):
    model, features, texts, X = reviews
    art = ModelArtifact.predicted_ratings(item_ids=np.arange(X.shape[0]),
                                          ratings=model.predict(X),
                                          scorer=Scorer.ordinal(model, 3, 2**12))
    with EmbeddedRedis() as server:
        publish("reviews", art, server.url)
        last = TopK(server.url, on_error="last_known", timeout=0.5)
        strict = TopK(server.url, timeout=0.5)
        fresh = last.predict_rating("reviews", text=texts[3])
        strict.predict_rating("reviews", text=texts[3])
    stale = last.predict_rating("reviews", text=texts[3])
    assert stale.stale and (stale.rating, stale.version) == (fresh.rating, fresh.version)
    with pytest.raises(RedisUnavailable):
        strict.predict_rating("reviews", text=texts[3])
    assert sp.issparse(last.versions.current["reviews"].scorer.rows([texts[3]]))
