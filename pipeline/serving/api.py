"""The HTTP API over the lookup client: an ASGI application (Starlette) that
``rankstream serve`` runs under uvicorn, bound to loopback unless told otherwise.

JSON in and out. A request the API cannot answer gets a 4xx with ``{"error": reason}`` (an
unknown model or route 404, a bad ``k`` or parameter 400, a missing or wrong token 401); Redis
unavailable is a 503; nothing answers with a traceback.

==========================================  ==================================================
``GET /healthz``                            the process is alive
``GET /readyz``                             Redis answers and every configured model is
                                            served (503 naming what is not)
``GET /v1/models``                          the models: served version, its metric, served
                                            as, age, share of fallback answers
``GET /v1/models/{model}``                  one of them
``GET /v1/models/{model}/recommend``        ``?user=U&k=K``: the top ``k`` for ``user`` (no
                                            user: the model's list for everyone)
==========================================  ==================================================

An answer is ``{"items": [{"item": …, "score": …}, …], "source": …, "version": …, "stale": …}``
(:class:`~pipeline.serving.answers.Recommendation`). With a token, every route but
``/healthz`` needs ``Authorization: Bearer <token>``, compared in constant time.
"""

from __future__ import annotations

import hmac
import logging
import time
from datetime import datetime, timezone

import redis
from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from pipeline.serving.fallback import RedisUnavailable
from pipeline.serving.layout import UnknownModelError
from pipeline.serving.versions import current_version, fallback_share

log = logging.getLogger(__name__)
MAX_K = 1000


def create_app(topk, *, models: list[str] | None = None, token: str | None = None,
               max_k: int = MAX_K) -> Starlette:
    """The application over ``topk`` (a :class:`~pipeline.serving.lookup.TopK`). ``models``:
    the configured model names (``/readyz`` and ``/v1/models`` cover them; without them,
    ``/v1/models`` lists none and ``/readyz`` checks Redis alone)."""
    configured = list(models or [])

    def guarded(handler, *, open_route: bool = False):
        async def endpoint(request: Request):
            if token and not open_route and not _authorized(request, token):
                return _error(401, "missing or wrong bearer token (Authorization: Bearer ...)")
            try:
                return JSONResponse(await _in_thread(handler, request))
            except HTTPException as err:
                return _error(err.status_code, err.detail)
            except UnknownModelError as err:
                return _error(404, str(err))
            except ValueError as err:
                return _error(400, str(err))
            except (RedisUnavailable, redis.ConnectionError, redis.TimeoutError,
                    ConnectionError, TimeoutError, OSError) as err:
                return _error(503, f"Redis is unavailable: {err}")
            except Exception as err:    # a bug: logged here, one line to the caller
                log.exception("%s %s failed", request.method, request.url.path)
                return _error(500, f"internal error ({type(err).__name__}); see the server log")
        return endpoint

    def healthz(request):
        return {"status": "ok"}

    def readyz(request):
        client = topk.transport.client
        client.ping()
        missing = [m for m in configured if _current(client, topk.namespace, m) is None]
        if missing:
            raise HTTPException(503, f"not served yet: {', '.join(missing)}")
        return {"status": "ready", "models": configured}

    def list_models(request):
        client = topk.transport.client
        return {"models": [_model_info(client, topk.namespace, m) for m in configured]}

    def one_model(request):
        model = request.path_params["model"]
        info = _model_info(topk.transport.client, topk.namespace, model)
        if info["version"] is None:
            raise UnknownModelError(f"model {model!r} has no published version")
        return info

    def recommend(request):
        model = request.path_params["model"]
        query = request.query_params
        unknown = set(query) - {"user", "k"}
        if unknown:
            raise ValueError(f"unknown parameters {sorted(unknown)}; expected user, k")
        k = _int_param(query.get("k", "10"), "k", 1, max_k)
        user = query.get("user")
        if user is not None and not user.strip():
            raise ValueError("user is empty: give a user id, or leave user out for the list "
                             "for everyone")
        rec = topk.recommend(model, user, k=k)
        return {"model": model, "user": rec.user,
                "items": [{"item": _plain(i), "score": float(s)} for i, s in rec.items],
                "source": rec.source, "version": rec.version, "stale": rec.stale}

    app = Starlette(routes=[
        Route("/healthz", guarded(healthz, open_route=True)),
        Route("/readyz", guarded(readyz)),
        Route("/v1/models", guarded(list_models)),
        Route("/v1/models/{model}", guarded(one_model)),
        Route("/v1/models/{model}/recommend", guarded(recommend)),
    ], exception_handlers={HTTPException: _http_error, 404: _http_error, 405: _http_error})
    return app


async def _in_thread(handler, request: Request):
    """Run a blocking handler (the lookup client is synchronous) off the event loop."""
    return await run_in_threadpool(handler, request)


def _authorized(request: Request, token: str) -> bool:
    given = request.headers.get("authorization", "")
    scheme, _, value = given.partition(" ")
    return scheme.lower() == "bearer" and hmac.compare_digest(value.strip().encode(),
                                                              token.encode())


def _error(status: int, reason: str) -> JSONResponse:
    return JSONResponse({"error": reason}, status_code=status)


async def _http_error(request: Request, exc) -> JSONResponse:
    """The router's own errors (no route, a method a route does not take), as JSON."""
    status = getattr(exc, "status_code", 404)
    if status == 404:
        return _error(404, f"no such route: {request.url.path[:200]} (see /v1/models)")
    if status == 405:
        return _error(405, f"{request.method} is not allowed on {request.url.path[:200]}")
    return _error(status, str(getattr(exc, "detail", "error")))


def _int_param(text: str, name: str, low: int, high: int) -> int:
    try:
        value = int(text)
    except ValueError:
        raise ValueError(f"{name} is {text!r:.40}, expected an integer") from None
    if not low <= value <= high:
        raise ValueError(f"{name} is {value}, expected {low}..{high}")
    return value


def _plain(item):
    """An item id as JSON has it (numpy integers become ints)."""
    return item.item() if hasattr(item, "item") else item


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
            "trained_at": current.trained_at, "age_seconds": _age(current.trained_at),
            "lookups": total, "fallback_share": share}


def _age(iso: str) -> float | None:
    try:
        then = datetime.fromisoformat(iso)
    except (TypeError, ValueError):
        return None
    if then.tzinfo is None:
        then = then.replace(tzinfo=timezone.utc)
    return round(time.time() - then.timestamp(), 1)
