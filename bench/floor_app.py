"""The floor of ``bench/serve_load.py --servers granian,floor``: an ASGI app that does nothing
but answer, under the same server (granian, the same settings as ``rankstream serve``) and the
same load. Every request gets one fixed JSON body the size of a recommend answer (k = 10); a
POST's body is read first; ``/metrics`` is empty (no handler histogram to read). What the real
server's p99 is over this one's is rankstream's cost; what this one's p99 is over the target is
the machine's (the cores that wrk, the server's workers and everything else share).

``floor-redis`` (``FLOOR_REDIS_URL`` set) makes one Redis round trip per request first, a GET
of one small key, as a lookup's version check does: the floor of any app that answers from
Redis, which is what rankstream's design asks of a lookup.
"""

from __future__ import annotations

import json
import os

BODY = json.dumps({"model": "movies", "user": "u123", "version": 1, "source": "precomputed",
                   "items": [{"item": f"m{1000 + n}", "score": 1.0 - n / 100}
                             for n in range(10)]}).encode()
HEADERS = [(b"content-type", b"application/json"), (b"content-length", str(len(BODY)).encode())]


def app():
    """The ASGI app (a factory, as ``rankstream serve`` gives granian one)."""
    url = os.environ.get("FLOOR_REDIS_URL")
    client = None
    if url:
        import redis

        client = redis.Redis.from_url(url)

    async def answer(scope, receive, send):
        if scope["type"] == "lifespan":
            while (await receive())["type"] != "lifespan.shutdown":
                await send({"type": "lifespan.startup.complete"})
            await send({"type": "lifespan.shutdown.complete"})
            return
        more = scope.get("method") == "POST"
        while more:
            more = (await receive()).get("more_body", False)
        if scope["path"] == "/metrics":
            await send({"type": "http.response.start", "status": 200,
                        "headers": [(b"content-type", b"text/plain")]})
            await send({"type": "http.response.body", "body": b""})
            return
        if client is not None:
            client.get("floor")       # sync, in the handler, as rankstream's lookups are
        await send({"type": "http.response.start", "status": 200, "headers": HEADERS})
        await send({"type": "http.response.body", "body": BODY})

    return answer
