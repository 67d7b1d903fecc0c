"""The API's router (pipeline.serving.routing): what a path matches, and what the application
answers a path or method no route takes, HEAD and the lifespan protocol, in process (the
real servers' runs are in test_http_api.py and test_http_routes.py)."""

from __future__ import annotations

import asyncio

from starlette.testclient import TestClient

from pipeline.serving.api import create_app
from pipeline.serving.openapi import ROUTES
from pipeline.serving.routing import Routes

TABLE = Routes([(name, path, methods, name) for name, path, methods in ROUTES])


def test_every_route_is_matched_by_its_own_path_with_its_parameter():
    for name, path, methods in ROUTES:
        concrete = path.replace("{model}", "my-model.v2")
        got_name, endpoint, params, allowed = TABLE.match(concrete)
        assert (got_name, endpoint) == (name, name)
        assert params == ({"model": "my-model.v2"} if "{model}" in path else {})
        assert set(methods) <= allowed and ("HEAD" in allowed) == ("GET" in methods)


def test_a_parameter_is_one_non_empty_segment_and_one_trailing_slash_is_ignored():
    assert TABLE.match("/v1/models//recommend") is None
    assert TABLE.match("/v1/models/a/b/recommend") is None
    assert TABLE.match("/v1/models/movies/recommend/")[2] == {"model": "movies"}
    assert TABLE.match("/v1/models/")[0] == "models"
    assert TABLE.match("/v1/models/movies")[0] == "model"
    assert TABLE.match("/v1/models/movies/nothing") is None
    assert TABLE.match("/") is None


def test_a_route_without_parameters_wins_over_one_with():
    routes = Routes([("any", "/items/{item}", ["GET"], 1), ("new", "/items/new", ["GET"], 2)])
    assert routes.match("/items/new")[:3] == ("new", 2, {})
    assert routes.match("/items/old")[:3] == ("any", 1, {"item": "old"})


def test_unknown_paths_and_methods_answer_json_with_the_allowed_methods():
    with TestClient(create_app(None)) as client:     # `with`: the lifespan protocol runs
        assert client.get("/healthz").json() == {"status": "ok"}
        assert client.head("/healthz").status_code == 200
        missing = client.get("/v2/models")
        assert missing.status_code == 404 and "no such route" in missing.json()["error"]
        wrong = client.delete("/v1/models/movies/recommend")
        assert wrong.status_code == 405 and "DELETE is not allowed" in wrong.json()["error"]
        assert wrong.headers["allow"] == "GET, HEAD, POST"


def test_the_lifespan_protocol_is_answered_and_ends_at_shutdown():
    app = create_app(None)
    inbox = [{"type": "lifespan.startup"}, {"type": "lifespan.shutdown"}]
    sent = []

    async def receive():
        return inbox.pop(0)

    async def send(message):
        sent.append(message["type"])

    asyncio.run(app({"type": "lifespan"}, receive, send))
    assert sent == ["lifespan.startup.complete", "lifespan.shutdown.complete"]


def test_a_request_is_counted_after_its_answer_is_sent():
    """The metrics' writes come after the answer's last message, so they add nothing to its
    latency; the latency they record is the handler's, taken before the send."""
    sent, counted = [], []

    class Recording:
        def observe(self, route, model, seconds, status, answers):
            counted.append((route, status, [m["type"] for m in sent]))

    app = create_app(None, metrics=Recording())

    async def receive():
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message):
        sent.append(message)

    scope = {"type": "http", "method": "GET", "path": "/healthz", "query_string": b"",
             "headers": []}
    asyncio.run(app(scope, receive, send))
    assert counted == [("healthz", 200, ["http.response.start", "http.response.body"])]
