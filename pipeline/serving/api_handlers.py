"""The HTTP API's route handlers, one per name in :data:`pipeline.serving.openapi.ROUTES`.

Each takes the Starlette request and reads what the application was built with from
``request.app.state``: ``topk`` (the lookup front, :class:`~pipeline.serving.lookup.TopK`, the
only way to Redis), ``models`` (the configured names), ``max_k`` and ``metrics``. A handler
returns the JSON object to answer (``"_answers"``: the lookup answers it holds, for the
metrics; not sent) or a ready Response; what it raises becomes a 4xx/5xx with a reason
(:func:`pipeline.serving.api.create_app` wraps every handler).
"""

from __future__ import annotations

import logging

from starlette.requests import Request
from starlette.responses import HTMLResponse, JSONResponse, Response

from pipeline.serving import openapi
from pipeline.serving.api_requests import (
    MAX_K,  # the default bound on k, and the most candidates one rank takes
    body_filters,
    check_k,
    fields,
    json_body,
    list_of,
    only,
    query_filters,
)
from pipeline.serving.layout import UnknownModelError

MAX_BATCH = 1000          # users in one batch request

log = logging.getLogger(__name__)


def answer(rec) -> dict:
    """A :class:`~pipeline.serving.answers.Recommendation` as the API answers it."""
    return {"user": rec.user, "items": [{"item": i, "score": s} for i, s in rec.items],
            "source": rec.source, "version": rec.version, "stale": rec.stale}


async def healthz(request: Request) -> dict:
    return {"status": "ok"}


SERVED, NEVER_TRAINED, UNAVAILABLE = "served", "never trained", "unavailable"


async def readyz(request: Request) -> Response | dict:
    """Ready when Redis answers and every required model (``rankstream serve --require``;
    default: every configured model that has a served version) answers. The body says per
    configured (and required) model ``served`` / ``never trained`` / ``unavailable``, and in
    ``healed`` when each served version that a refresher published again after Redis lost
    the model was published."""
    state = request.app.state
    topk, required = state.topk, list(state.required or [])
    topk.ping()                         # Redis down: a 503 "Redis is unavailable"
    models, healed = {}, {}
    for model in dict.fromkeys([*state.models, *required]):
        try:
            served = topk.served_version(model)
        except Exception as err:        # noqa: BLE001 - this model's keys, not Redis: say so
            log.warning("readyz: model %r unavailable: %s", model, err)
            models[model] = UNAVAILABLE
            continue
        models[model] = NEVER_TRAINED if served is None else SERVED
        if served is not None and served.healed_at:
            healed[model] = served.healed_at
    if not required:
        required = [m for m, said in models.items() if said != NEVER_TRAINED]
    not_ready = [m for m in required if models[m] != SERVED]
    if not_ready:
        return JSONResponse({"status": "not ready", "error": "required models not served: "
                             + ", ".join(f"{m} ({models[m]})" for m in not_ready),
                             "models": models, "healed": healed}, status_code=503)
    return {"status": "ready", "models": models, "healed": healed}


async def list_models(request: Request) -> dict:
    topk = request.app.state.topk
    return {"models": [topk.model_info(m).to_dict() for m in request.app.state.models]}


async def one_model(request: Request) -> dict:
    model = request.path_params["model"]
    info = request.app.state.topk.model_info(model)
    if info.version is None:
        raise UnknownModelError(f"model {model!r} has no published version (model_info)")
    return info.to_dict()


async def recommend(request: Request) -> dict:
    model, topk, max_k = request.path_params["model"], request.app.state.topk, \
        request.app.state.max_k
    if request.method == "POST":            # a batch
        args = fields(await json_body(request), {"users", "k", "exclude", "allow"},
                      required={"users"})
        users = list_of(args, "users", MAX_BATCH)
        if any(not isinstance(u, (str, int)) or isinstance(u, bool) or u == ""
               for u in users):
            raise ValueError("users must be non-empty strings or integers")
        k = check_k(args.get("k", 10), max_k)
        recs = topk.recommend_many(model, users, k=k, **body_filters(args))
        return {"model": model, "answers": [answer(r) for r in recs], "_answers": recs}
    query = request.query_params
    only(query, {"user", "k", "exclude", "allow"})
    user = query.get("user")
    if user is not None and not user.strip():
        raise ValueError("user is empty: give a user id, or leave user out for the list "
                         "for everyone")
    rec = topk.recommend(model, user, k=check_k(query.get("k", "10"), max_k),
                         **query_filters(query))
    return {"model": model, **answer(rec), "_answers": (rec,)}


async def similar(request: Request) -> dict:
    model, query = request.path_params["model"], request.query_params
    only(query, {"item", "k", "exclude", "allow"})
    item = query.get("item")
    if not item:
        raise ValueError("item is missing: give the item id to find similar items for")
    k = check_k(query.get("k", "10"), request.app.state.max_k)
    rec = request.app.state.topk.similar(model, item, k=k, **query_filters(query))
    out = answer(rec)
    out["item"] = out.pop("user")       # the item asked about; no "user" in a similar answer
    return {"model": model, **out, "_answers": (rec,)}


async def explain(request: Request) -> dict:
    """Why a user gets an item: the terms of their history (:mod:`.explain`)."""
    model, query = request.path_params["model"], request.query_params
    only(query, {"user", "item", "k"})
    user, item = query.get("user"), query.get("item")
    if user is None or not user.strip():
        raise ValueError("user is missing: give the user whose item to explain")
    if not item:
        raise ValueError("item is missing: give the item to explain")
    k = check_k(query.get("k", "10"), request.app.state.max_k)
    return {**request.app.state.topk.explain(model, user, item, k=k).to_dict(), "model": model}


async def fold_in(request: Request) -> dict:
    model = request.path_params["model"]
    args = fields(await json_body(request), {"items", "comparisons", "k", "exclude", "allow"})
    if "items" not in args and "comparisons" not in args:
        raise ValueError("give items (the user's met items) and/or comparisons "
                         "([[winner, loser], ...])")
    rec = request.app.state.topk.fold_in(
        model, list_of(args, "items", None, default=[]),
        k=check_k(args.get("k", 10), request.app.state.max_k),
        comparisons=list_of(args, "comparisons", None, default=[]), **body_filters(args))
    return {"model": model, **answer(rec), "_answers": (rec,)}


async def rank(request: Request) -> dict:
    model, max_k = request.path_params["model"], request.app.state.max_k
    args = fields(await json_body(request), {"candidates", "k", "query"},
                  required={"candidates"})
    candidates = []
    for n, c in enumerate(list_of(args, "candidates", MAX_K)):
        if not isinstance(c, dict) or "id" not in c:
            raise ValueError(f"candidates[{n}] is {str(c)[:60]!r}, expected "
                             '{"id": ..., "features": ... and/or "text": ...}')
        # a plain features list or text takes the scorer's fast path for such rows
        x = {"features": c.get("features"), "text": c.get("text")}
        candidates.append((c["id"], x["features"] if x["text"] is None else
                           x["text"] if x["features"] is None else x))
    rec = request.app.state.topk.rank(
        model, candidates, k=check_k(args.get("k", len(candidates)), max_k, low=0),
        query=args.get("query"))
    return {"model": model, **answer(rec), "_answers": (rec,)}


async def rate(request: Request) -> dict:
    model = request.path_params["model"]
    args = fields(await json_body(request), {"features", "text"})
    pred = request.app.state.topk.predict_rating(model, features=args.get("features"),
                                                 text=args.get("text"))
    return {"model": model, "rating": pred.rating, "score": pred.score,
            "version": pred.version, "stale": pred.stale}


async def spec(request: Request) -> dict:
    return openapi.SPEC


async def docs(request: Request) -> Response:
    return HTMLResponse(openapi.html())


async def scrape(request: Request) -> Response:
    metrics = request.app.state.metrics
    return Response(metrics.exposition(), media_type=metrics.content_type)


# route name (openapi.ROUTES) -> handler
HANDLERS = {"healthz": healthz, "readyz": readyz, "models": list_models, "model": one_model,
            "recommend": recommend, "similar": similar, "explain": explain,
            "fold_in": fold_in, "rank": rank,
            "rate": rate, "openapi": spec, "docs": docs, "metrics": scrape}
