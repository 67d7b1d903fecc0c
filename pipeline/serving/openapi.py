"""The API's routes and their OpenAPI 3.1 description: ``ROUTES`` is what
:func:`pipeline.serving.api.create_app` mounts, ``SPEC`` what ``/openapi.json`` serves (built
from the same table, so the two cannot drift), ``html()`` the page ``/docs`` shows (plain
HTML, no script from anywhere).
"""

from __future__ import annotations

import html as _html

# (handler name, path, methods); the router tries them in this order, so the lookups come first
ROUTES = [
    ("recommend", "/v1/models/{model}/recommend", ["GET", "POST"]),
    ("similar", "/v1/models/{model}/similar", ["GET"]),
    ("explain", "/v1/models/{model}/explain", ["GET"]),
    ("fold_in", "/v1/models/{model}/fold_in", ["POST"]),
    ("rank", "/v1/models/{model}/rank", ["POST"]),
    ("rate", "/v1/models/{model}/rate", ["POST"]),
    ("model", "/v1/models/{model}", ["GET"]),
    ("models", "/v1/models", ["GET"]),
    ("healthz", "/healthz", ["GET"]),
    ("readyz", "/readyz", ["GET"]),
    ("metrics", "/metrics", ["GET"]),
    ("openapi", "/openapi.json", ["GET"]),
    ("docs", "/docs", ["GET"]),
]


def _q(name: str, description: str, schema: dict, required: bool = False) -> dict:
    return {"name": name, "in": "query", "required": required, "description": description,
            "schema": schema}


_ID = {"oneOf": [{"type": "string"}, {"type": "integer"}]}
_IDS = {"type": "array", "items": _ID, "maxItems": 1000}
_K = {"type": "integer", "minimum": 1, "maximum": 1000, "default": 10}
_FILTERS = [
    _q("exclude", "items to leave out: repeated (exclude=a&exclude=b) and/or "
       "comma-separated (exclude=a,b); at most 1000", _IDS),
    _q("allow", "the items that may be answered, given as exclude is (given: only these)",
       _IDS),
]
_ITEMS = {"type": "array", "items": {"type": "object", "properties": {
    "item": _ID, "score": {"type": "number"}}}}
ANSWER = {"type": "object", "properties": {
    "model": {"type": "string"}, "user": {}, "items": _ITEMS,
    "source": {"type": "string", "description": "precomputed | fresh (the user's list "
               "rewritten by the refresher since the version was published) | on_demand | "
               "global | fallback | missing | scored | fold_in, or what the version serves "
               "instead: trivial, challenger-NAME, blend-NAME"},
    "version": {"type": "integer"}, "stale": {"type": "boolean"}}}
# similar's answer names the item asked about (as given), not a user
SIMILAR = {"type": "object", "properties": {
    **{k: v for k, v in ANSWER["properties"].items() if k != "user"},
    "item": {"type": "string", "description": "the item asked about, as given"}}}
ERROR = {"type": "object", "properties": {"error": {"type": "string"}}}
_NUMBER = {"type": "number"}
_TERM = {"type": "object", "properties": {
    "item": _ID, "winner": _ID, "loser": _ID, "term": _NUMBER,
    "share": {"type": ["number", "null"], "description": "term / score"},
    "comparisons": {"type": "integer", "description": "implicit comparisons (the item against "
                    "sampled unmet items) summed into the term"},
    "part": {"type": "integer"}, "method": {"type": "string"}}}
EXPLANATION = {"type": "object", "properties": {
    "model": {"type": "string"}, "user": {}, "item": {}, "version": {"type": "integer"},
    "score": {"type": ["number", "null"], "description": "the served score, v·u + b"},
    "method": {"type": "string", "description": "pairwise | least_squares | item_item | "
               "blend | none"},
    "computed": {"type": "string", "description": "how the terms were computed"},
    "factor": {"type": "string", "description": "published | fresh (the refresher's)"},
    "contributions": {"type": "array", "items": _TERM, "description": "the k largest terms"},
    "n_terms": {"type": "integer"}, "rest": {**_NUMBER, "description": "the other terms"},
    "bias": _NUMBER, "residual": {**_NUMBER, "description": "score − bias − every term: what "
                                  "the served factor holds beyond the user's history"},
    "history": {"type": "array", "items": _ID, "description": "the user's met items"},
    "note": {"type": ["string", "null"], "description": "why nothing is split (a global "
             "list, a version without fold-in)"}}}


def _body(properties: dict, required: list) -> dict:
    return {"required": True, "content": {"application/json": {"schema": {
        "type": "object", "properties": properties, "required": required,
        "additionalProperties": False}}}}


def _json(schema: dict, description: str) -> dict:
    return {"description": description, "content": {"application/json": {"schema": schema}}}


_ERRORS = {"400": _json(ERROR, "a bad parameter or body"), "401": _json(ERROR, "no token"),
           "404": _json(ERROR, "unknown model, user, item or route"),
           "413": _json(ERROR, "a body over 1 MiB"), "503": _json(ERROR, "Redis unavailable")}
_MODEL = {"name": "model", "in": "path", "required": True, "schema": {"type": "string"}}

OPERATIONS = {
    ("healthz", "GET"): {"summary": "the process is alive (no token needed)"},
    ("readyz", "GET"): {"summary": "Redis answers and every required model is served "
                        "(rankstream serve --require; default: every configured model that "
                        "has a served version); per configured model: served, never trained "
                        "or unavailable"},
    ("metrics", "GET"): {"summary": "Prometheus metrics (text exposition format)"},
    ("openapi", "GET"): {"summary": "this description"},
    ("docs", "GET"): {"summary": "this description as a page"},
    ("models", "GET"): {"summary": "the configured models: served version, metrics, age, "
                        "share of fallback answers"},
    ("model", "GET"): {"summary": "one model's served version"},
    ("recommend", "GET"): {"summary": "the top k items for a user (no user: the list for "
                           "everyone); exactly k whenever k eligible items exist",
                           "parameters": [_q("user", "user id", {"type": "string"}),
                                          _q("k", "items to answer", _K), *_FILTERS],
                           "answer": ANSWER},
    ("recommend", "POST"): {"summary": "recommend for a batch of users, one version",
                            "body": _body({"users": {**_IDS}, "k": _K, "exclude": _IDS,
                                           "allow": _IDS}, ["users"]),
                            "answer": {"type": "object", "properties": {
                                "model": {"type": "string"},
                                "answers": {"type": "array", "items": ANSWER}}}},
    ("similar", "GET"): {"summary": "the k items most like an item (cosine of item factors)",
                         "parameters": [_q("item", "item id", _ID, True),
                                        _q("k", "items to answer", _K), *_FILTERS],
                         "answer": SIMILAR},
    ("explain", "GET"): {"summary": "why a user gets an item: the served score split into one "
                         "term per item they met (or comparison), exactly: the terms, the "
                         "item's bias and the residual add up to the score",
                         "parameters": [_q("user", "user id", {"type": "string"}, True),
                                        _q("item", "item id", _ID, True),
                                        _q("k", "terms to list (the largest)", _K)],
                         "answer": EXPLANATION},
    ("fold_in", "POST"): {"summary": "recommendations for a new user from items they met "
                          "and/or comparisons, by solving their factor against the served "
                          "item factors",
                          "body": _body({"items": {**_IDS, "maxItems": 500},
                                         "comparisons": {"type": "array", "maxItems": 500,
                                                         "items": {"type": "array",
                                                                   "items": _ID}},
                                         "k": _K, "exclude": _IDS, "allow": _IDS}, []),
                          "answer": ANSWER},
    ("rank", "POST"): {"summary": "rank candidates given in the request by the served model",
                       "body": _body({"candidates": {"type": "array", "maxItems": 1000,
                                                     "items": {"type": "object"}},
                                      "k": _K, "query": {}}, ["candidates"]),
                       "answer": ANSWER},
    ("rate", "POST"): {"summary": "an ordinal model's rating of an item given by features "
                       "and/or text",
                       "body": _body({"features": {}, "text": {"type": "string"}}, []),
                       "answer": {"type": "object", "properties": {
                           "rating": {"type": "integer"}, "score": {"type": "number"},
                           "version": {"type": "integer"}}}},
}


def _operation(name: str, path: str, method: str) -> dict:
    op = OPERATIONS[(name, method)]
    out = {"operationId": f"{name}_{method.lower()}", "summary": op["summary"],
           "responses": {"200": _json(op.get("answer", {"type": "object"}), "the answer"),
                         **_ERRORS}}
    params = ([_MODEL] if "{model}" in path else []) + op.get("parameters", [])
    if params:
        out["parameters"] = params
    if "body" in op:
        out["requestBody"] = op["body"]
    return out


SPEC = {
    "openapi": "3.1.0",
    "info": {"title": "rankstream", "version": "1",
             "description": "Top-K lookups of the models rankstream publishes to Redis."},
    "components": {"securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}}},
    "security": [{"bearer": []}],
    "paths": {path: {m.lower(): _operation(name, path, m) for m in methods}
              for name, path, methods in ROUTES},
}


def html() -> str:
    """The routes of ``SPEC`` as one plain page."""
    rows = []
    for path, ops in SPEC["paths"].items():
        for method, op in ops.items():
            params = ", ".join(p["name"] for p in op.get("parameters", []))
            body = op.get("requestBody", {}).get("content", {}).get("application/json", {})
            fields = ", ".join(body.get("schema", {}).get("properties", {}))
            rows.append("<tr>" + "".join(f"<td>{_html.escape(x)}</td>" for x in (
                method.upper(), path, op["summary"], params, fields)) + "</tr>")
    return ("<!doctype html><html><head><meta charset='utf-8'><title>rankstream API</title>"
            "<style>body{font-family:sans-serif;margin:2em}td,th{padding:4px 10px;"
            "border-bottom:1px solid #ddd;text-align:left;vertical-align:top}</style></head>"
            "<body><h1>rankstream API</h1><p>Machine-readable: <a href='/openapi.json'>"
            "/openapi.json</a> (OpenAPI 3.1).</p><table><tr><th>method</th><th>path</th>"
            "<th>what</th><th>query</th><th>JSON body</th></tr>" + "".join(rows)
            + "</table></body></html>")
