"""What the HTTP API reads of a request, checked: the bearer token, a JSON body (at most
``MAX_BODY`` bytes, an object), and the parameters a route takes. A value that does not fit
raises ValueError (400) with a reason that names it, or :class:`BadBody` with its own status.

Examples
--------
>>> int_in("7", "k", 1, 1000)
7
>>> fields({"users": [1], "k": 3}, {"users", "k"}, required={"users"})
{'users': [1], 'k': 3}
>>> int_in(0, "k", 1, 1000)
Traceback (most recent call last):
...
ValueError: k is 0, expected 1..1000
"""

from __future__ import annotations

import difflib
import hmac
from typing import TYPE_CHECKING

import msgspec

from pipeline.serving.answer_builders import MAX_K  # the one bound on k

if TYPE_CHECKING:
    from starlette.requests import Request

MAX_BODY = 1 << 20        # bytes of a request body


class BadBody(ValueError):
    """A body that is too big (413) or not the JSON object the route takes (400)."""

    def __init__(self, status: int, reason: str):
        super().__init__(reason)
        self.status = status


def authorized(request: Request, token: str) -> bool:
    """Whether the request carries ``Authorization: Bearer <token>`` (compared in constant
    time)."""
    given = request.headers.get("authorization", "")
    scheme, _, value = given.partition(" ")
    return scheme.lower() == "bearer" and hmac.compare_digest(value.strip().encode(),
                                                              token.encode())


async def json_body(request: Request) -> dict:
    """The body as a JSON object; read at most ``MAX_BODY`` bytes of it."""
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > MAX_BODY:
        raise BadBody(413, f"the body is {int(declared):,} bytes, at most {MAX_BODY:,}")
    raw = bytearray()
    async for chunk in request.stream():
        raw += chunk
        if len(raw) > MAX_BODY:
            raise BadBody(413, f"the body is over {MAX_BODY:,} bytes")
    try:
        body = msgspec.json.decode(bytes(raw))
    except msgspec.DecodeError as err:
        raise BadBody(400, f"the body is not JSON ({err})") from None
    if not isinstance(body, dict):
        raise BadBody(400, f"the body is a JSON {type(body).__name__}, expected an object")
    return body


def only(query, names: set) -> None:
    """ValueError when ``query`` (or a body) has a name not in ``names``."""
    unknown = set(query) - names
    if unknown:
        raise ValueError(f"unknown parameters {sorted(unknown)}; expected "
                         f"{', '.join(sorted(names))}")


def fields(body: dict | None, names: set, required: set = frozenset()) -> dict:
    """``body`` when it has only ``names`` and all of ``required``."""
    body = body or {}
    only(body, names)
    missing = required - set(body)
    if missing:
        raise ValueError(f"the body lacks {sorted(missing)}")
    return body


def list_of(args: dict, name: str, limit: int | None, default=None) -> list:
    """``args[name]``, a list of at most ``limit`` entries."""
    value = args.get(name, default)
    if not isinstance(value, list):
        raise ValueError(f"{name} is a {type(value).__name__}, expected a list")
    if limit is not None and len(value) > limit:
        raise ValueError(f"{name} has {len(value)} entries, at most {limit}")
    return value


def int_in(value, name: str, low: int, high: int) -> int:
    """``value`` (an int, or its decimal string) when it lies in ``low..high``."""
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


def check_k(value, high: int = MAX_K, low: int = 1) -> int:
    """The one rule for ``k`` (the API's routes and ``rankstream recommend``): an integer in
    ``low..high`` (default 1..MAX_K), else ValueError ``k is 0, expected 1..1000``."""
    return int_in(value, "k", low, high)


def unknown_model_reason(model: str, known) -> str:
    """What a caller can act on when ``model`` is not served: a "did you mean" among
    ``known`` (the configured / served names) and, when there are few, the list itself.
    Never the Redis host or key names (those go to the server log)."""
    known = sorted({str(m) for m in known or ()})
    reason = f"model {str(model)[:100]!r} is not served"
    if str(model) in known:
        return reason + " (configured, but no version of it is published yet)"
    close = difflib.get_close_matches(str(model), known, n=3, cutoff=0.6)
    if close:
        reason += f"; did you mean {' or '.join(repr(c) for c in close)}?"
    if known and len(known) <= 10:
        reason += f" (models: {', '.join(known)})"
    return reason


def body_filters(args: dict) -> dict:
    """``exclude`` / ``allow`` of a JSON body (lists of item ids; absent: no filter)."""
    out = {}
    for name in ("exclude", "allow"):
        if name in args:
            values = list_of(args, name, None)
            if any(isinstance(v, (dict, list, float, bool)) or v is None for v in values):
                raise ValueError(f"{name} must list item ids (strings or integers)")
            out[name] = values
    return out


def query_filters(query) -> dict:
    """``exclude`` / ``allow`` of a query string: repeated per item (``exclude=a&exclude=b``)
    and/or comma-separated (``exclude=a,b``), the two mixed as given; empty entries skipped.
    An id with a comma in it can only be given in a JSON body."""
    out = {}
    for name in ("exclude", "allow"):
        if name in query:
            ids = [part.strip() for value in query.getlist(name) for part in value.split(",")]
            out[name] = [i for i in ids if i]
    return out
