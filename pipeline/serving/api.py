"""The HTTP API over the lookup client: an ASGI application (:mod:`.routing`, with Starlette's
requests and responses) that ``rankstream serve`` runs, bound to loopback unless told
otherwise.

JSON in and out; every route and its parameters are in ``/openapi.json`` (:mod:`.openapi`),
readable at ``/docs``; the handlers are :mod:`.api_handlers`, what they read of a request
:mod:`.api_requests`. A request the API cannot answer gets a 4xx with ``{"error": reason}``
(an unknown model, user, item or route 404, a bad parameter or body 400, a body over
``MAX_BODY`` 413, a missing or wrong token 401); Redis unavailable is a 503; nothing answers
with a traceback.

An answer is ``{"items": [{"item": …, "score": …}, …], "source": …, "version": …, "stale": …}``
(:class:`~pipeline.serving.answers.Recommendation`). With a token, every route but
``/healthz`` needs ``Authorization: Bearer <token>``, compared in constant time.

Handlers run on the event loop, not in a thread pool: a lookup is one or two Redis round
trips of tens of microseconds, less than a thread hop costs, and ``rankstream serve`` runs one
process per core for concurrency. A Redis that stops answering costs one request the lookup
client's ``timeout`` (0.1 s by default); once half of its last round trips failed (or a
connection was refused) its circuit breaker answers without Redis until a probe succeeds.
"""

from __future__ import annotations

import logging
import time
from functools import partial

import msgspec
import redis
from starlette.exceptions import HTTPException
from starlette.requests import ClientDisconnect, Request
from starlette.responses import Response

from pipeline.serving import openapi, ui
from pipeline.serving.api_handlers import HANDLERS, MAX_BATCH, MAX_K
from pipeline.serving.api_requests import MAX_BODY, BadBody, authorized, unknown_model_reason
from pipeline.serving.explain import UnknownUserError
from pipeline.serving.fallback import RedisUnavailable
from pipeline.serving.item_queries import UnknownItemError
from pipeline.serving.layout import UnknownModelError
from pipeline.serving.routing import AFTER, Api, Routes

__all__ = ["create_app", "MAX_K", "MAX_BATCH", "MAX_BODY", "CLIENT_CLOSED"]

# the status a request is counted under when its client hung up before the answer (nginx's
# 499 "client closed request"): not a 5xx, and nothing is sent (nobody is there to read it)
CLIENT_CLOSED = 499

log = logging.getLogger(__name__)


def create_app(topk, *, models: list[str] | None = None, token: str | None = None,
               max_k: int = MAX_K, metrics=None, require: list[str] | None = None,
               ui_sources: ui.UiSources | None = None) -> Api:
    """The application over ``topk`` (a :class:`~pipeline.serving.lookup.TopK`). ``models``:
    the configured model names (``/readyz`` and ``/v1/models`` cover them); ``require``: the
    models ``/readyz`` needs served (None: every configured model that has a served version);
    ``metrics``: a :class:`~pipeline.serving.http_metrics.ServeMetrics` (None: no
    ``/metrics`` route); ``ui_sources``: what the ``/ui`` pages read besides Redis (item
    titles, the runs directory; :class:`~pipeline.serving.ui.UiSources`)."""
    names = {name for name in HANDLERS if metrics is not None or name != "metrics"}
    routes = [(name, path, methods,
               endpoint(name, HANDLERS[name], open_route=name == "healthz"))
              for name, path, methods in openapi.ROUTES if name in names]
    routes += [(name, path, ["GET"], endpoint(name, handler))   # HTML, not in the spec
               for name, path, handler in ui.ROUTES]
    app = Api(Routes(routes), _no_route)
    app.state.topk, app.state.models, app.state.token = topk, list(models or []), token
    app.state.max_k, app.state.metrics = max_k, metrics
    app.state.required = list(require or [])
    app.state.ui = ui_sources or ui.UiSources()
    return app


def endpoint(name: str, handler, *, open_route: bool = False):
    """``handler`` as the endpoint of route ``name``: the bearer token checked (unless
    ``open_route``), its answer sent as JSON, what it raises sent as ``{"error": reason}``
    with its status, and the request counted in the app's metrics."""
    async def respond(request: Request) -> Response:
        state = request.app.state
        started = time.perf_counter()
        model = request.path_params.get("model")
        status, answers = 200, ()
        try:
            if state.token and not open_route and not authorized(request, state.token):
                status = 401
                return _error(401, "missing or wrong bearer token (Authorization: "
                              "Bearer ...)")
            result = await handler(request)
            if isinstance(result, Response):
                status = result.status_code
                return result
            answers = result.pop("_answers", ())
            return _json(result)
        except ClientDisconnect:
            # the client hung up mid-body: its doing, not a server error; one line, no trace
            status = CLIENT_CLOSED
            log.info("%s %s: the client closed the connection before its body was read",
                     request.method, request.url.path[:200])
            return Response(status_code=CLIENT_CLOSED)
        except Exception as err:        # noqa: BLE001 - every error becomes one JSON line
            status, reason = _failure(err, request)
            if status == 404 and isinstance(err, UnknownModelError):
                model = None            # no label for a name nobody published
            redis_down = status == 503 and not isinstance(err, HTTPException)
            if redis_down and state.metrics is not None:
                state.metrics.redis_error(model)
            return _error(status, reason)
        finally:
            if state.metrics is not None:    # counted once the answer is sent (routing.AFTER)
                request.scope[AFTER] = partial(state.metrics.observe, name, model,
                                               time.perf_counter() - started, status, answers)
    return respond


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
    if isinstance(err, BadBody):
        return err.status, str(err)
    if isinstance(err, HTTPException):
        return err.status_code, str(err.detail)
    if isinstance(err, UnknownModelError):
        # the detail (namespace, key names) is for the operator, not the caller
        log.info("%s %s: %s", request.method, request.url.path[:200], err)
        return 404, unknown_model_reason(request.path_params.get("model", ""),
                                         request.app.state.models)
    if isinstance(err, (UnknownItemError, UnknownUserError)):
        return 404, str(err)
    if isinstance(err, ValueError):
        return 400, str(err)
    if isinstance(err, (RedisUnavailable, redis.ConnectionError, redis.TimeoutError,
                        ConnectionError, TimeoutError, OSError)):
        return 503, f"Redis is unavailable: {err}"
    log.exception("%s %s failed", request.method, request.url.path)   # a bug: in the log
    return 500, f"internal error ({type(err).__name__}); see the server log"


async def _no_route(request: Request, status: int) -> Response:
    """The router's own errors (no route: 404, a method the route does not take: 405)."""
    if status == 405:
        return _error(405, f"{request.method} is not allowed on {request.url.path[:200]}")
    return _error(404, f"no such route: {request.url.path[:200]} (see /openapi.json)")
