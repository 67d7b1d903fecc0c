"""The HTTP API over the lookup client: an ASGI application (Starlette) that
``rankstream serve`` runs, bound to loopback unless told otherwise.

JSON in and out; every route and its parameters are in ``/openapi.json`` (:mod:`.openapi`),
readable at ``/docs``. A request the API cannot answer gets a 4xx with ``{"error": reason}``
(an unknown model, item or route 404, a bad parameter or body 400, a body over
``MAX_BODY`` 413, a missing or wrong token 401); Redis unavailable is a 503; nothing answers
with a traceback.

An answer is ``{"items": [{"item": …, "score": …}, …], "source": …, "version": …, "stale": …}``
(:class:`~pipeline.serving.answers.Recommendation`). With a token, every route but
``/healthz`` needs ``Authorization: Bearer <token>``, compared in constant time.

Handlers run on the event loop, not in a thread pool: a lookup is one or two Redis round
trips of tens of microseconds, less than a thread hop costs, and ``rankstream serve`` runs one
process per core for concurrency. A Redis that stops answering costs one request the lookup
client's ``timeout`` (0.1 s by default); after that the client does not try Redis for its
retry interval.
"""

from __future__ import annotations

import hmac
import logging
import time

import msgspec
import redis
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import HTMLResponse, Response
from starlette.routing import Route

from pipeline.serving import openapi
from pipeline.serving.fallback import RedisUnavailable
from pipeline.serving.item_queries import UnknownItemError
from pipeline.serving.layout import UnknownModelError
from pipeline.serving.versions import age_seconds, current_version, fallback_share

log = logging.getLogger(__name__)
MAX_K = 1000
MAX_BATCH = 1000          # users in one batch request
MAX_BODY = 1 << 20        # bytes of a request body


class _BadBody(ValueError):
    """A body that is too big (413) or not the JSON object the route takes (400)."""

    def __init__(self, status: int, reason: str):
        super().__init__(reason)
        self.status = status


def create_app(topk, *, models: list[str] | None = None, token: str | None = None,
               max_k: int = MAX_K, metrics=None) -> Starlette:
    """The application over ``topk`` (a :class:`~pipeline.serving.lookup.TopK`). ``models``:
    the configured model names (``/readyz`` and ``/v1/models`` cover them); ``metrics``: a
    :class:`~pipeline.serving.metrics.ServeMetrics` (None: no ``/metrics`` route)."""
    configured = list(models or [])

    def guarded(name: str, handler, *, open_route: bool = False):
        async def endpoint(request: Request):
            started = time.perf_counter()
            model = request.path_params.get("model")
            status, answers = 200, ()
            try:
                if token and not open_route and not _authorized(request, token):
                    status = 401
                    return _error(401, "missing or wrong bearer token (Authorization: "
                                  "Bearer ...)")
                body = await _json_body(request) if request.method == "POST" else None
                result = handler(request, body)
                if isinstance(result, Response):
                    return result
                answers = result.pop("_answers", ())
                return _json(result)
            except Exception as err:        # noqa: BLE001 - every error becomes one JSON line
                status, reason = _failure(err, request)
                if status == 404 and isinstance(err, UnknownModelError):
                    model = None            # no label for a name nobody published
                redis_down = status == 503 and not isinstance(err, HTTPException)
                if redis_down and metrics is not None:
                    metrics.redis_error(model)
                return _error(status, reason)
            finally:
                if metrics is not None:
                    metrics.observe(name, model, time.perf_counter() - started, status,
                                    answers)
        return endpoint

    def healthz(request, body):
        return {"status": "ok"}

    def readyz(request, body):
        client = topk.transport.client
        client.ping()
        missing = [m for m in configured if _current(client, topk.namespace, m) is None]
        if missing:
            raise HTTPException(503, f"not served yet: {', '.join(missing)}")
        return {"status": "ready", "models": configured}

    def list_models(request, body):
        client = topk.transport.client
        return {"models": [_model_info(client, topk.namespace, m) for m in configured]}

    def one_model(request, body):
        model = request.path_params["model"]
        info = _model_info(topk.transport.client, topk.namespace, model)
        if info["version"] is None:
            raise UnknownModelError(f"model {model!r} has no published version")
        return info

    def recommend(request, body):
        model = request.path_params["model"]
        if body is not None:            # POST: a batch
            args = _fields(body, {"users", "k", "exclude", "allow"}, required={"users"})
            users = _list(args, "users", MAX_BATCH)
            if any(not isinstance(u, (str, int)) or isinstance(u, bool) or u == ""
                   for u in users):
                raise ValueError("users must be non-empty strings or integers")
            k = _int(args.get("k", 10), "k", 1, max_k)
            recs = topk.recommend_many(model, users, k=k, **_filters(args))
            return {"model": model, "answers": [_answer(r) for r in recs], "_answers": recs}
        query = request.query_params
        _only(query, {"user", "k", "exclude", "allow"})
        user = query.get("user")
        if user is not None and not user.strip():
            raise ValueError("user is empty: give a user id, or leave user out for the list "
                             "for everyone")
        rec = topk.recommend(model, user, k=_int(query.get("k", "10"), "k", 1, max_k),
                             **_query_filters(query))
        return {"model": model, **_answer(rec), "_answers": (rec,)}

    def similar(request, body):
        model, query = request.path_params["model"], request.query_params
        _only(query, {"item", "k", "exclude", "allow"})
        item = query.get("item")
        if not item:
            raise ValueError("item is missing: give the item id to find similar items for")
        rec = topk.similar(model, item, k=_int(query.get("k", "10"), "k", 1, max_k),
                           **_query_filters(query))
        return {"model": model, **_answer(rec), "_answers": (rec,)}

    def fold_in(request, body):
        model = request.path_params["model"]
        args = _fields(body, {"items", "comparisons", "k", "exclude", "allow"})
        if "items" not in args and "comparisons" not in args:
            raise ValueError("give items (the user's met items) and/or comparisons "
                             "([[winner, loser], ...])")
        rec = topk.fold_in(model, _list(args, "items", None, default=[]),
                           k=_int(args.get("k", 10), "k", 1, max_k),
                           comparisons=_list(args, "comparisons", None, default=[]),
                           **_filters(args))
        return {"model": model, **_answer(rec), "_answers": (rec,)}

    def rank(request, body):
        model = request.path_params["model"]
        args = _fields(body, {"candidates", "k", "query"}, required={"candidates"})
        candidates = []
        for n, c in enumerate(_list(args, "candidates", MAX_K)):
            if not isinstance(c, dict) or "id" not in c:
                raise ValueError(f"candidates[{n}] is {str(c)[:60]!r}, expected "
                                 '{"id": ..., "features": ... and/or "text": ...}')
            # a plain features list or text takes the scorer's fast path for such rows
            x = {"features": c.get("features"), "text": c.get("text")}
            candidates.append((c["id"], x["features"] if x["text"] is None else
                               x["text"] if x["features"] is None else x))
        rec = topk.rank(model, candidates, k=_int(args.get("k", len(candidates)), "k", 0,
                                                  max_k), query=args.get("query"))
        return {"model": model, **_answer(rec), "_answers": (rec,)}

    def rate(request, body):
        model = request.path_params["model"]
        args = _fields(body, {"features", "text"})
        pred = topk.predict_rating(model, features=args.get("features"),
                                   text=args.get("text"))
        return {"model": model, "rating": pred.rating, "score": pred.score,
                "version": pred.version, "stale": pred.stale}

    def spec(request, body):
        return openapi.SPEC

    def docs(request, body):
        return HTMLResponse(openapi.html())

    def scrape(request, body):
        return Response(metrics.exposition(), media_type=metrics.content_type)

    handlers = {"healthz": healthz, "readyz": readyz, "models": list_models,
                "model": one_model, "recommend": recommend, "similar": similar,
                "fold_in": fold_in, "rank": rank, "rate": rate, "openapi": spec, "docs": docs}
    if metrics is not None:
        handlers["metrics"] = scrape
    routes = [Route(path, guarded(name, handlers[name], open_route=name == "healthz"),
                    methods=methods)
              for name, path, methods in openapi.ROUTES if name in handlers]
    return Starlette(routes=routes, exception_handlers={
        HTTPException: _http_error, 404: _http_error, 405: _http_error})


# ---------------------------------------------------------------------- requests

def _authorized(request: Request, token: str) -> bool:
    given = request.headers.get("authorization", "")
    scheme, _, value = given.partition(" ")
    return scheme.lower() == "bearer" and hmac.compare_digest(value.strip().encode(),
                                                              token.encode())


async def _json_body(request: Request) -> dict:
    """The body as a JSON object; read at most ``MAX_BODY`` bytes of it."""
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > MAX_BODY:
        raise _BadBody(413, f"the body is {int(declared):,} bytes, at most {MAX_BODY:,}")
    raw = bytearray()
    async for chunk in request.stream():
        raw += chunk
        if len(raw) > MAX_BODY:
            raise _BadBody(413, f"the body is over {MAX_BODY:,} bytes")
    try:
        body = msgspec.json.decode(bytes(raw))
    except msgspec.DecodeError as err:
        raise _BadBody(400, f"the body is not JSON ({err})") from None
    if not isinstance(body, dict):
        raise _BadBody(400, f"the body is a JSON {type(body).__name__}, expected an object")
    return body


def _only(query, names: set) -> None:
    unknown = set(query) - names
    if unknown:
        raise ValueError(f"unknown parameters {sorted(unknown)}; expected "
                         f"{', '.join(sorted(names))}")


def _fields(body: dict | None, names: set, required: set = frozenset()) -> dict:
    body = body or {}
    _only(body, names)
    missing = required - set(body)
    if missing:
        raise ValueError(f"the body lacks {sorted(missing)}")
    return body


def _list(args: dict, name: str, limit: int | None, default=None) -> list:
    value = args.get(name, default)
    if not isinstance(value, list):
        raise ValueError(f"{name} is a {type(value).__name__}, expected a list")
    if limit is not None and len(value) > limit:
        raise ValueError(f"{name} has {len(value)} entries, at most {limit}")
    return value


def _int(value, name: str, low: int, high: int) -> int:
    if isinstance(value, str):
        try:
            value = int(value)
        except ValueError:
            raise ValueError(f"{name} is {value!r:.40}, expected an integer") from None
    if not isinstance(value, int) or isinstance(value, bool):
        raise ValueError(f"{name} is {str(value)[:40]!r}, expected an integer")
    if not low <= value <= high:
        raise ValueError(f"{name} is {value}, expected {low}..{high}")
    return value


def _filters(args: dict) -> dict:
    """``exclude`` / ``allow`` of a JSON body (lists of item ids; absent: no filter)."""
    out = {}
    for name in ("exclude", "allow"):
        if name in args:
            values = _list(args, name, None)
            if any(isinstance(v, (dict, list, float, bool)) or v is None for v in values):
                raise ValueError(f"{name} must list item ids (strings or integers)")
            out[name] = values
    return out


def _query_filters(query) -> dict:
    """``exclude`` / ``allow`` of a query string (each repeated per item)."""
    return {name: query.getlist(name) for name in ("exclude", "allow") if name in query}


# ---------------------------------------------------------------------- answers

def _answer(rec) -> dict:
    return {"user": rec.user, "items": [{"item": i, "score": s} for i, s in rec.items],
            "source": rec.source, "version": rec.version, "stale": rec.stale}


def _plain(value):
    """numpy scalars as JSON has them."""
    if hasattr(value, "item"):
        return value.item()
    raise TypeError(f"{type(value).__name__} is not JSON")


_ENCODER = msgspec.json.Encoder(enc_hook=_plain)


def _json(content, status: int = 200) -> Response:
    return Response(_ENCODER.encode(content), status_code=status,
                    media_type="application/json")


def _error(status: int, reason: str) -> Response:
    return _json({"error": reason}, status)


def _failure(err: Exception, request: Request) -> tuple[int, str]:
    """(status, one-line reason) of an error a handler raised."""
    if isinstance(err, _BadBody):
        return err.status, str(err)
    if isinstance(err, HTTPException):
        return err.status_code, str(err.detail)
    if isinstance(err, (UnknownModelError, UnknownItemError)):
        return 404, str(err)
    if isinstance(err, ValueError):
        return 400, str(err)
    if isinstance(err, (RedisUnavailable, redis.ConnectionError, redis.TimeoutError,
                        ConnectionError, TimeoutError, OSError)):
        return 503, f"Redis is unavailable: {err}"
    log.exception("%s %s failed", request.method, request.url.path)   # a bug: in the log
    return 500, f"internal error ({type(err).__name__}); see the server log"


async def _http_error(request: Request, exc) -> Response:
    """The router's own errors (no route, a method a route does not take), as JSON."""
    status = getattr(exc, "status_code", 404)
    if status == 404:
        return _error(404, f"no such route: {request.url.path[:200]} (see /openapi.json)")
    if status == 405:
        return _error(405, f"{request.method} is not allowed on {request.url.path[:200]}")
    return _error(status, str(getattr(exc, "detail", "error")))


# ---------------------------------------------------------------------- model info

def _current(client, namespace: str, model: str):
    return current_version(model, client, namespace=namespace)


def _model_info(client, namespace: str, model: str) -> dict:
    """The served version of ``model``: its metrics, what it serves, its age, and the share
    of its lookups answered from the fallback list."""
    current = _current(client, namespace, model)
    if current is None:
        return {"model": model, "version": None}
    share, total = fallback_share(model, client, current.version, namespace=namespace)
    return {"model": model, "version": current.version, "algorithm": current.algorithm,
            "kind": current.kind, "served_as": current.served_as, "metrics": current.metrics,
            "trained_at": current.trained_at, "age_seconds": age_seconds(current.trained_at),
            "lookups": total, "fallback_share": share}
