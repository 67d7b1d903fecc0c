"""The API's ASGI application: a path's segments matched against a fixed route table, the
endpoint called with a Starlette request, its response sent. No middleware stack: every
endpoint (:func:`pipeline.serving.api.endpoint`) already turns what it raises into an answer,
so the layers Starlette's application adds around its router (two exception middlewares, the
router's dispatch, a second request object) only cost CPU: about 20 of a recommend's 160 µs,
measured in process.

A template's ``{name}`` segment matches one non-empty path segment (what Starlette's ``{name}``
matches) and reaches the request as ``request.path_params[name]``; a path with one trailing
slash is the path without it. ``GET`` routes take ``HEAD`` too. What an endpoint leaves
under ``scope[AFTER]`` (a callable) runs once its response is sent, or failed to send: the
metrics' bookkeeping then adds nothing to the latency of the answer it counts.

Examples
--------
>>> routes = Routes([("item", "/v1/items/{item}", ["GET"], None), ("all", "/v1/items", ["GET"],
...                   None)])
>>> name, _, params, methods = routes.match("/v1/items/42/")
>>> name, params, sorted(methods)
('item', {'item': '42'}, ['GET', 'HEAD'])
>>> routes.match("/v1/items")[0], routes.match("/v2")
('all', None)
"""

from __future__ import annotations

from starlette.datastructures import State
from starlette.requests import Request

AFTER = "rankstream.after_response"


class Routes:
    """``(name, path template, methods, endpoint)`` rows."""

    def __init__(self, rows):
        self.rows = []
        for name, path, methods, endpoint in rows:
            allowed = frozenset(methods) | ({"HEAD"} if "GET" in methods else set())
            self.rows.append((name, endpoint, tuple(path.strip("/").split("/")), allowed))
        self.static = {}   # a path without parameters -> its row: the common case, one lookup
        for row in self.rows:
            if not any(s.startswith("{") for s in row[2]):
                self.static.setdefault(row[2], row)

    def match(self, path: str):
        """``(name, endpoint, path params, methods)`` of the route ``path`` matches (one
        without parameters first, then the others in their order), or None."""
        parts = tuple(path.strip("/").split("/")) if path.endswith("/") and path != "/" \
            else tuple(path[1:].split("/"))
        row = self.static.get(parts)
        if row is not None:
            return row[0], row[1], {}, row[3]
        for name, endpoint, template, allowed in self.rows:
            if len(template) != len(parts):
                continue
            params = {}
            for want, got in zip(template, parts):
                if want[0] == "{":
                    if not got:
                        break
                    params[want[1:-1]] = got
                elif want != got:
                    break
            else:
                return name, endpoint, params, allowed
        return None


class Api:
    """The ASGI application over ``routes``; ``state``: what the endpoints read
    (``request.app.state``); ``not_found(request, status)``: the response of a path no
    route matches (404) or a method its route does not take (405)."""

    def __init__(self, routes: Routes, not_found):
        self.routes, self.not_found, self.state = routes, not_found, State()

    async def __call__(self, scope, receive, send) -> None:
        kind = scope["type"]
        if kind == "http":
            scope["app"] = self
            found = self.routes.match(scope["path"])
            if found is not None and scope["method"] in found[3]:
                scope["path_params"] = found[2]
                response = await found[1](Request(scope, receive))
            elif found is None:
                response = await self.not_found(Request(scope, receive), 404)
            else:
                response = await self.not_found(Request(scope, receive), 405)
                response.headers["allow"] = ", ".join(sorted(found[3]))
            try:
                await response(scope, receive, send)
            finally:
                after = scope.get(AFTER)
                if after is not None:
                    after()
        elif kind == "lifespan":          # nothing to start or stop: say so when asked
            while True:
                message = await receive()
                if message["type"] == "lifespan.startup":
                    await send({"type": "lifespan.startup.complete"})
                elif message["type"] == "lifespan.shutdown":
                    await send({"type": "lifespan.shutdown.complete"})
                    return
        elif kind == "websocket":         # no websocket routes
            await send({"type": "websocket.close", "code": 1000})
