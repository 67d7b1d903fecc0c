"""The API's routes beyond one user's list, through a real `rankstream serve` (granian, two
workers) and a real Redis: filters, batches, similar items, fold-in, rank, rate, the OpenAPI
description, body limits, and /metrics scraped with the Prometheus text parser."""

from __future__ import annotations

import time

import httpx
import numpy as np
import pytest
from prometheus_client.parser import text_string_to_metric_families

from pipeline.features import feature_rows
from pipeline.serving.artifact import ModelArtifact
from pipeline.serving.http_metrics import FLUSH_SECONDS
from pipeline.serving.lookup import TopK
from pipeline.serving.openapi import SPEC
from pipeline.serving.publish import publish
from pipeline.serving.scorers import Scorer
from solvers import NPSVOR, KernelRankSVM
from tests.serving.helpers import user_model
from tests.serving.test_http_api import _serve

FOLD = {"method": "pairwise", "reg": 0.5, "loss": "squared_hinge", "per_item": 5}


@pytest.fixture(scope="module")
def api(tmp_path_factory, redis_url):
    """(base URL, namespace, user model artifact) of a server over three models."""
    tmp = tmp_path_factory.mktemp("routes")
    namespace = f"routes{tmp.name[-6:]}"
    art = user_model(11, fold_in=FOLD, trained_at="2026-01-01T00:00:00+00:00")
    publish("movies", art, redis_url, top_k=10, namespace=namespace)
    rng = np.random.default_rng(1)
    X = rng.normal(size=(120, 3))
    y = (X[:, 0] > 0).astype(int) + (X[:, 1] > 0.5)
    ranker = KernelRankSVM(C=1.0, gamma=0.5, random_state=0, n_threads=1).fit(
        X, y, np.repeat(np.arange(12), 10))
    publish("search", ModelArtifact.query_docs(
        query_ids=["q"], doc_ids=[f"d{i}" for i in range(10)], indptr=[0, 10],
        docs=np.arange(10), scores=ranker.decision_function(X[:10]),
        scorer=Scorer.kernel(ranker)), redis_url, namespace=namespace)
    labels = np.clip(np.round(X[:, 0] * 1.5 + 3), 1, 5).astype(int)
    rows, _ = feature_rows([list(range(3))] * len(X), X.tolist(), 3, None, 0)
    rater = NPSVOR(C1=1.0, random_state=0, n_threads=1).fit(rows, labels)
    publish("stars", ModelArtifact.predicted_ratings(
        item_ids=np.arange(len(X)), ratings=rater.predict(rows),
        scores=rater.predict_score(rows), scorer=Scorer.ordinal(rater, 3, 0)),
        redis_url, namespace=namespace)
    config = tmp / "models.toml"
    config.write_text('[models.movies]\nalgorithm = "altsvm"\n')
    with _serve(redis_url, tmp, "--namespace", namespace, "--config", str(config),
                "--workers", "2") as base:
        yield base, namespace, art


def _get(base, path, **params):
    return httpx.get(base + path, params=params, timeout=10)


def test_filters_batches_and_similar_answer_what_the_client_answers(api, redis_url):
    base, namespace, art = api
    user, ids = str(art.key_ids[5]), [int(x) for x in art.item_ids]
    with TopK(redis_url, namespace=namespace, timeout=2.0) as topk:
        want = topk.recommend("movies", user, k=12, exclude=ids[:30], allow=ids[:60])
        got = _get(base, "/v1/models/movies/recommend", user=user, k=12,
                   exclude=ids[:30], allow=ids[:60]).json()
        assert len(got["items"]) == 12 and got["version"] == want.version
        assert [(x["item"], x["score"]) for x in got["items"]] == [
            (i, pytest.approx(s)) for i, s in want.items]
        batch = httpx.post(f"{base}/v1/models/movies/recommend", json={
            "users": [user, "nobody"], "k": 4, "exclude": ids[:3]}).json()["answers"]
        assert [a["source"] for a in batch] == ["precomputed", "fallback"]
        assert batch[0]["items"] == [{"item": i, "score": pytest.approx(s)} for i, s in
                                     topk.recommend("movies", user, k=4, exclude=ids[:3]).items]
        similar = _get(base, "/v1/models/movies/similar", item=ids[7], k=5).json()
        assert [x["item"] for x in similar["items"]] == [
            i for i, _ in topk.similar("movies", ids[7], k=5).items]
        folded = httpx.post(f"{base}/v1/models/movies/fold_in",
                            json={"items": ids[:20], "k": 6}).json()
        assert folded["source"] == "fold_in" and len(folded["items"]) == 6
        assert [x["item"] for x in folded["items"]] == [
            i for i, _ in topk.fold_in("movies", ids[:20], k=6).items]
        candidates = [{"id": f"c{i}", "features": [float(i % 3), -1.0, 0.5 * i]}
                      for i in range(8)]
        ranked = httpx.post(f"{base}/v1/models/search/rank", json={
            "candidates": candidates, "k": 3, "query": "q"}).json()
        want = topk.rank("search", [(c["id"], c["features"]) for c in candidates], k=3)
        assert ranked["source"] == "scored" and [x["item"] for x in ranked["items"]] == [
            i for i, _ in want.items]
        rated = httpx.post(f"{base}/v1/models/stars/rate",
                           json={"features": [1.2, 0.0, -0.3]}).json()
        pred = topk.predict_rating("stars", features=[1.2, 0.0, -0.3])
        assert (rated["rating"], rated["score"]) == (pred.rating, pytest.approx(pred.score))
    no_scorer = httpx.post(f"{base}/v1/models/movies/rate", json={"text": "x"})
    assert no_scorer.status_code in (400, 404, 409) and "scorer" in no_scorer.json()["error"]


@pytest.mark.parametrize("method, path, body, status, says", [
    ("POST", "/v1/models/movies/recommend", b"{not json", 400, "not JSON"),
    ("POST", "/v1/models/movies/recommend", b"[1, 2]", 400, "expected an object"),
    ("POST", "/v1/models/movies/recommend", b'{"k": 3}', 400, "lacks ['users']"),
    ("POST", "/v1/models/movies/recommend", b'{"users": [{"a": 1}]}', 400, "users must"),
    ("POST", "/v1/models/movies/recommend", b'{"users": ["1"], "k": true}', 400, "integer"),
    ("POST", "/v1/models/movies/fold_in", b"{}", 400, "give items"),
    ("POST", "/v1/models/movies/fold_in", b'{"items": 5}', 400, "expected a list"),
    ("POST", "/v1/models/movies/fold_in", b'{"items": [1], "exclude": [[1]]}', 400,
     "must list item ids"),
    ("GET", "/v1/models/movies/similar?item=424242", None, 404, "not in model"),
    ("GET", "/v1/models/movies/similar", None, 400, "item is missing"),
    ("GET", "/v1/models/nothing/similar?item=1", None, 404, "model 'nothing' is not served"),
    ("POST", "/v1/models/movies/rank", b'{"candidates": [5]}', 400, "expected {"),
    ("DELETE", "/v1/models/movies/recommend", None, 405, "not allowed"),
])
def test_bad_bodies_are_json_4xx(api, method, path, body, status, says):
    got = httpx.request(method, api[0] + path, content=body, timeout=10)
    assert got.status_code == status and says in got.json()["error"], got.text


def test_an_over_size_body_and_filter_are_refused(api):
    base = api[0]
    big = httpx.post(f"{base}/v1/models/movies/recommend", content=b"{" + b" " * (2 << 20),
                     timeout=10)
    assert big.status_code == 413 and "at most" in big.json()["error"]
    many = httpx.post(f"{base}/v1/models/movies/recommend",
                      json={"users": ["1"], "exclude": list(range(1001))}, timeout=10)
    assert many.status_code == 400 and "at most 1000" in many.json()["error"]


def test_openapi_lists_every_route_the_app_mounts(api):
    base = api[0]
    spec = _get(base, "/openapi.json").json()
    assert spec == SPEC and spec["openapi"].startswith("3.")
    for path, ops in spec["paths"].items():
        for method in ops:
            concrete = path.replace("{model}", "movies")
            got = httpx.request(method.upper(), base + concrete, timeout=10)
            assert got.status_code != 404 or "no such route" not in got.text, path
    page = _get(base, "/docs")
    assert page.status_code == 200 and "/v1/models/{model}/fold_in" in page.text


def _samples(text: str) -> dict:
    out = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def test_metrics_move_with_requests_across_workers(api):
    base, _, art = api
    before = _samples(_get(base, "/metrics").text)
    n = 40
    for i in range(n):
        _get(base, "/v1/models/movies/recommend", user=str(art.key_ids[i % 20]), k=3)
    _get(base, "/v1/models/movies/recommend", user="nobody", k=3)
    _get(base, "/v1/models/ghost/recommend", user="x")
    # each worker writes its counts at most FLUSH_SECONDS after a request; a scrape that
    # reaches the other worker first sees them then
    time.sleep(2 * FLUSH_SECONDS)
    after = _samples(_get(base, "/metrics").text)

    def moved(name, **labels):
        key = (name, tuple(sorted(labels.items())))
        return after.get(key, 0) - before.get(key, 0)

    assert moved("rankstream_request_seconds_count", route="recommend", model="movies") == n + 1
    assert moved("rankstream_answers_total", model="movies", source="precomputed") == n
    assert moved("rankstream_answers_total", model="movies", source="fallback") == 1
    assert moved("rankstream_requests_total", route="recommend", status="404") == 1
    assert not any("ghost" in str(k) for k in after)            # no label for unknown names
    fast = moved("rankstream_request_seconds_bucket", route="recommend", model="movies",
                 le="0.002")
    assert 0 < fast <= n + 1
    assert after[("rankstream_served_version", (("model", "movies"),))] == 1
    assert after[("rankstream_model_age_seconds", (("model", "movies"),))] > 86_400
    assert after[("rankstream_redis_up", ())] == 1
