"""The findings of issue 37 about the HTTP API and `rankstream recommend`, in process (the
application over a real TopK and a real Redis): client hang-ups, errors that hide internals,
one k rule, the similar answer's fields, comma-separated filters, and readiness."""

from __future__ import annotations

import asyncio
import logging
import subprocess
import sys

import pytest
from prometheus_client.parser import text_string_to_metric_families
from starlette.testclient import TestClient

from pipeline.serving.api import create_app
from pipeline.serving.http_metrics import ServeMetrics
from pipeline.serving.lookup import TopK
from pipeline.serving.publish import publish
from tests.ingest.factory import REPO
from tests.serving.helpers import user_model

CONFIGURED = ["movies", "search", "ads", "reviews"]


@pytest.fixture(scope="module")
def published(redis_url, tmp_path_factory):
    """(redis_url, namespace, artifact): of the four configured models only movies trained."""
    namespace = f"find{tmp_path_factory.mktemp('f').name[-6:]}"
    art = user_model(37)
    publish("movies", art, redis_url, top_k=10, namespace=namespace)
    return redis_url, namespace, art


@pytest.fixture
def app_of(published):
    """A factory of applications over the published namespace."""
    redis_url, namespace, _ = published
    clients = []

    def make(models=CONFIGURED, **kw):
        topk = TopK(redis_url, namespace=namespace, timeout=2.0)
        clients.append(topk)
        return create_app(topk, models=list(models), **kw), topk
    yield make
    for topk in clients:
        topk.close()


def _requests_by_status(metrics) -> dict:
    out = {}
    for family in text_string_to_metric_families(metrics.exposition().decode()):
        for s in family.samples:
            if s.name == "rankstream_requests_total":
                out[(s.labels["route"], s.labels["status"])] = s.value
    return out


def test_a_client_that_hangs_up_mid_body_is_not_a_500(app_of, caplog, monkeypatch):
    monkeypatch.delenv("PROMETHEUS_MULTIPROC_DIR", raising=False)
    app, topk = app_of()
    metrics = ServeMetrics(topk, CONFIGURED)
    app.state.metrics = metrics
    messages = [{"type": "http.request", "body": b'{"users": [', "more_body": True},
                {"type": "http.disconnect"}]
    sent = []

    async def receive():
        return messages.pop(0) if messages else {"type": "http.disconnect"}

    async def send(message):
        sent.append(message)

    scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1",
             "method": "POST", "scheme": "http", "path": "/v1/models/movies/recommend",
             "raw_path": b"/v1/models/movies/recommend", "query_string": b"",
             "root_path": "", "headers": [(b"content-type", b"application/json")],
             "client": ("127.0.0.1", 1), "server": ("127.0.0.1", 80)}
    with caplog.at_level(logging.DEBUG):
        asyncio.run(app(scope, receive, send))
    counts = _requests_by_status(metrics)
    assert counts.get(("recommend", "500"), 0) == 0, counts
    assert counts.get(("recommend", "499")) == 1, counts
    assert not any(r.exc_info for r in caplog.records), [r.getMessage() for r in caplog.records]
    closed = [r for r in caplog.records if "closed the connection" in r.getMessage()]
    assert len(closed) == 1 and "\n" not in closed[0].getMessage()


def test_an_unknown_model_404_hides_internals_and_suggests(app_of, published, caplog):
    _, namespace, _ = published
    app, _ = app_of()
    with TestClient(app) as client, caplog.at_level(logging.INFO):
        for path in ("/v1/models/moveis/recommend?user=1", "/v1/models/moveis",
                     "/v1/models/moveis/similar?item=100"):
            got = client.get(path)
            assert got.status_code == 404, got.text
            error = got.json()["error"]
            assert error.startswith("model 'moveis' is not served"), error
            assert "did you mean 'movies'?" in error and "ads, movies, reviews, search" in error
            for internal in (namespace, "current", "does not exist", "127.0.0.1", "{"):
                assert internal not in error, error
    assert any(":current" in r.getMessage() for r in caplog.records)   # the detail: in the log


def _recommend(published, tmp_path, *args):
    redis_url, namespace, _ = published
    config = tmp_path / "models.toml"
    config.write_text("".join(f'[models.{m}]\nalgorithm = "altsvm"\n' for m in CONFIGURED))
    return subprocess.run([sys.executable, "-m", "pipeline.cli", "recommend", *args,
                           "--redis-url", redis_url, "--namespace", namespace,
                           "--home", str(tmp_path / "home"), "--config", str(config)],
                          cwd=REPO, capture_output=True, text=True, timeout=120)


def test_recommend_cli_suggests_a_model_and_keeps_the_k_rule(published, tmp_path):
    out = _recommend(published, tmp_path, "moveis", "1")
    assert out.returncode == 1 and len(out.stderr.strip().splitlines()) == 1, out.stderr
    assert "did you mean 'movies'?" in out.stderr and "current" not in out.stderr
    for k, says in (("0", "k is 0, expected 1..1000"), ("100000", "k is 100000, expected "
                                                                  "1..1000")):
        out = _recommend(published, tmp_path, "movies", "1", "-k", k)
        assert out.returncode == 2 and out.stdout == "", (out.stdout, out.stderr)
        assert out.stderr.strip().splitlines() == [f"rankstream recommend: {says}"]
    ok = _recommend(published, tmp_path, "movies", "1", "-k", "1000")
    assert ok.returncode == 0, ok.stderr


def test_k_is_one_rule_in_the_api_and_the_cli():
    from pipeline.serving import api, api_handlers, api_requests

    assert api.MAX_K == api_handlers.MAX_K == api_requests.MAX_K == 1000
    with pytest.raises(ValueError, match="k is 0, expected 1..1000"):
        api_requests.check_k(0)
    with pytest.raises(ValueError, match="k is 100000, expected 1..1000"):
        api_requests.check_k("100000")


def test_similar_answers_with_item_not_user(app_of, published):
    _, _, art = published
    app, _ = app_of()
    item = int(art.item_ids[3])
    with TestClient(app) as client:
        got = client.get("/v1/models/movies/similar", params={"item": item, "k": 3}).json()
    assert got["item"] == str(item) and "user" not in got and len(got["items"]) == 3
    from pipeline.serving.openapi import SPEC

    schema = SPEC["paths"]["/v1/models/{model}/similar"]["get"]["responses"]["200"]
    props = schema["content"]["application/json"]["schema"]["properties"]
    assert "item" in props and "user" not in props and "items" in props


def test_comma_separated_filters_are_ids_not_one_unknown_id(app_of, published):
    _, _, art = published
    app, _ = app_of()
    user = int(art.key_ids[4])
    with TestClient(app) as client:
        plain = client.get("/v1/models/movies/recommend", params={"user": user, "k": 5})
        top = [x["item"] for x in plain.json()["items"]]
        url = "/v1/models/movies/recommend"
        comma = client.get(url, params={"user": user, "k": 5,
                                        "exclude": f"{top[0]},{top[1]}"}).json()
        repeated = client.get(url, params=[("user", user), ("k", 5), ("exclude", top[0]),
                                           ("exclude", top[1])]).json()
        allowed = client.get(url, params={"user": user, "k": 5,
                                          "allow": f"{top[2]}, {top[3]}"}).json()
    got = [x["item"] for x in comma["items"]]
    assert top[0] not in got and top[1] not in got and len(got) == 5
    assert comma["items"] == repeated["items"]
    assert [x["item"] for x in allowed["items"]] == top[2:4]


def test_readiness_with_one_of_four_models_trained(app_of):
    app, _ = app_of()
    with TestClient(app) as client:
        got = client.get("/readyz")
    assert got.status_code == 200, got.text
    assert got.json()["models"] == {"movies": "served", "search": "never trained",
                                    "ads": "never trained", "reviews": "never trained"}
    required, _ = app_of(require=["movies", "search"])
    with TestClient(required) as client:
        got = client.get("/readyz")
    assert got.status_code == 503, got.text
    assert got.json()["models"]["search"] == "never trained"
    assert "search" in got.json()["error"] and "movies (" not in got.json()["error"]
    fine, _ = app_of(require=["movies"])
    with TestClient(fine) as client:
        assert client.get("/readyz").status_code == 200
