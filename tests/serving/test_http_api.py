"""``rankstream serve``: a real uvicorn process on loopback, a real HTTP client, a real
redis-server. Answers as the lookup client gives them; every bad request a JSON 4xx."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from contextlib import contextmanager

import httpx
import numpy as np
import pytest

from pipeline.serving.artifact import ModelArtifact
from pipeline.serving.publish import publish
from tests.ingest.factory import REPO
from tests.servers import free_port_block


@contextmanager
def _serve(redis_url: str, tmp_path, *extra: str, env=None):
    """A `rankstream serve` on a free loopback port; yields its base URL, stops it after."""
    port = free_port_block(1, offset=0)
    proc = subprocess.Popen([sys.executable, "-m", "pipeline.cli", "serve", "--port", str(port),
                             "--redis-url", redis_url, "--home", str(tmp_path / "home"),
                             *extra], cwd=REPO, env=env, stderr=subprocess.DEVNULL)
    base = f"http://127.0.0.1:{port}"
    try:
        for _ in range(200):
            if proc.poll() is not None:
                raise RuntimeError(f"serve exited with status {proc.returncode}")
            try:
                if httpx.get(f"{base}/healthz", timeout=1).status_code == 200:
                    break
            except httpx.TransportError:
                time.sleep(0.1)
        yield base
    finally:
        proc.terminate()      # the process this helper started (its Popen), nothing else
        proc.wait(timeout=20)


@pytest.fixture
def served(tmp_path, redis_url):
    """(base URL, namespace, token) of a `rankstream serve` over one published model."""
    namespace = f"api{tmp_path.name[-10:]}"
    rng = np.random.default_rng(0)
    art = ModelArtifact.user_item(user_ids=[f"u{i}" for i in range(30)],
                                  item_ids=list(range(100, 140)),
                                  user_factors=rng.normal(size=(30, 4)),
                                  item_factors=rng.normal(size=(40, 4)), algorithm="altsvm")
    publish("movies", art, redis_url, top_k=20, namespace=namespace)
    config = tmp_path / "models.toml"
    config.write_text('[models.movies]\nalgorithm = "altsvm"\n'
                      '[models.later]\nalgorithm = "toppush"\n')
    token = "s3cret-token"
    env = {**os.environ, "RANKSTREAM_API_TOKEN": token}
    with _serve(redis_url, tmp_path, "--namespace", namespace, "--config", str(config),
                env=env) as base:
        yield base, namespace, token, art


def test_recommend_over_http_is_what_the_lookup_client_answers(served):
    base, _, token, art = served
    auth = {"Authorization": f"Bearer {token}"}
    got = httpx.get(f"{base}/v1/models/movies/recommend", params={"user": "u3", "k": 5},
                    headers=auth)
    assert got.status_code == 200, got.text
    body = got.json()
    scores = art.item_factors @ art.user_factors[3]
    best = np.argsort(-scores)[:5]
    assert [x["item"] for x in body["items"]] == [100 + int(i) for i in best]
    assert body["source"] == "precomputed" and body["version"] == 1 and not body["stale"]
    everyone = httpx.get(f"{base}/v1/models/movies/recommend", params={"k": 3}, headers=auth)
    assert everyone.json()["source"] == "fallback" and len(everyone.json()["items"]) == 3
    info = httpx.get(f"{base}/v1/models/movies", headers=auth).json()
    assert info["version"] == 1 and info["kind"] == "user_item" and info["age_seconds"] is None
    listed = httpx.get(f"{base}/v1/models", headers=auth).json()["models"]
    assert [m["model"] for m in listed] == ["movies", "later"] and listed[1]["version"] is None
    ready = httpx.get(f"{base}/readyz", headers=auth)      # "later" was never trained
    assert ready.status_code == 200, ready.text
    assert ready.json()["models"] == {"movies": "served", "later": "never trained"}


@pytest.mark.parametrize("path, params, status, says", [
    ("/v1/models/nothing/recommend", {"user": "u1"}, 404, "model 'nothing' is not served"),
    ("/v1/models/nothing", {}, 404, "model 'nothing' is not served"),
    ("/v1/models/later", {}, 404, "configured, but no version of it is published yet"),
    ("/v1/models/movies/recommend", {"user": "u1", "k": "-1"}, 400, "k is -1, expected 1..1000"),
    ("/v1/models/movies/recommend", {"user": "u1", "k": "ten"}, 400, "expected an integer"),
    ("/v1/models/movies/recommend", {"user": "u1", "k": "100000"}, 400, "expected 1..1000"),
    ("/v1/models/movies/recommend", {"usr": "u1"}, 400, "unknown parameters ['usr']"),
    ("/v2/anything", {}, 404, "no such route"),
    ("/v1/models/movies/recommend", {"user": ""}, 400, "user is empty"),
])
def test_a_bad_request_is_a_json_4xx(served, path, params, status, says):
    base, _, token, _ = served
    got = httpx.get(base + path, params=params, headers={"Authorization": f"Bearer {token}"})
    assert got.status_code == status and says in got.json()["error"], got.text


def test_every_route_but_healthz_needs_the_token(served):
    base, _, token, _ = served
    assert httpx.get(f"{base}/healthz").status_code == 200
    for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": token}):
        got = httpx.get(f"{base}/v1/models/movies/recommend", params={"user": "u1"},
                        headers=headers)
        assert got.status_code == 401 and "bearer token" in got.json()["error"]
        assert token not in got.text


def test_random_requests_get_json_and_never_a_5xx(served):
    """Random routes, methods, query strings and bodies: every answer is JSON, none a 5xx."""
    from hypothesis import HealthCheck, given, settings
    from hypothesis import strategies as st

    base, _, token, _ = served
    from pipeline.serving.openapi import ROUTES

    routes = [p.replace("{model}", m) for _, p, _ in ROUTES for m in ("movies", "%00", "x" * 300)
              if "{model}" in p or m == "movies"]
    paths = st.sampled_from(sorted(set(routes)) + ["/v1/models/movies/recommend/extra"])
    text = st.text(max_size=40)
    ids = st.one_of(st.integers(-2**70, 2**70), st.text(max_size=8), st.floats(), st.none())
    json_value = st.recursive(st.one_of(ids, st.booleans()),
                              lambda inner: st.lists(inner, max_size=4)
                              | st.dictionaries(st.text(max_size=8), inner, max_size=4),
                              max_leaves=12)
    fields = st.sampled_from(["users", "items", "comparisons", "k", "exclude", "allow",
                              "candidates", "features", "text", "query", "x"])
    bodies = st.one_of(st.binary(max_size=200),
                       st.dictionaries(fields, json_value, max_size=4).map(
                           lambda d: json.dumps(d, allow_nan=True).encode()))
    auth = st.sampled_from([{"Authorization": f"Bearer {token}"}, {}, {"Authorization": "x"}])

    @settings(max_examples=250, deadline=None,
              suppress_health_check=[HealthCheck.function_scoped_fixture])
    @given(paths, st.sampled_from(["GET", "POST", "PUT", "DELETE"]),
           st.dictionaries(st.sampled_from(["user", "k", "item", "exclude", "allow", "x"]),
                           text, max_size=3), bodies, auth)
    def check(path, method, params, body, headers):
        got = httpx.request(method, base + path, params=params, content=body, headers=headers,
                            timeout=10)
        assert got.status_code < 500 or got.status_code == 503, (path, params, body, got.text)
        assert "Traceback" not in got.text
        if got.headers["content-type"].startswith("application/json"):
            assert isinstance(got.json(), dict), got.text
        else:   # the metrics and the docs page
            assert path in ("/metrics", "/docs") and got.status_code == 200, got.text

    check()


def test_redis_down_is_a_503_on_every_route_that_needs_it(tmp_path):
    """A server whose Redis is gone stays up and says so: 503 with a reason, never a 500."""
    with _serve(f"redis://127.0.0.1:{free_port_block(1, offset=0)}/0", tmp_path) as base:
        for path in ("/readyz", "/v1/models/movies", "/v1/models/movies/recommend?user=u1"):
            got = httpx.get(base + path)
            assert got.status_code == 503 and "unavailable" in got.json()["error"], got.text


def test_a_taken_port_is_one_line_not_a_backtrace(tmp_path, redis_url):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        out = subprocess.run([sys.executable, "-m", "pipeline.cli", "serve", "--port", str(port),
                              "--redis-url", redis_url, "--home", str(tmp_path / "home")],
                             cwd=REPO, capture_output=True, text=True, timeout=60)
    assert out.returncode == 1 and len(out.stderr.strip().splitlines()) == 1, out.stderr
    assert f"cannot listen on 127.0.0.1:{port}" in out.stderr
