"""Every served model heals, not only the one with users to refresh (issue 51): the shipped
``ads`` (TopPush: a global list), ``search`` (kernel RankSVM: per-query lists) and ``reviews``
(NPSVOR: predicted ratings) configs trained and published to a real redis-server, Redis
emptied (FLUSHDB: a restart without persistence), and each model's refresher's watch (what
its loop runs every second, no Kafka needed for it) republishes its last checkpoint: served
again, the heal counted."""

from __future__ import annotations

from pathlib import Path

import pytest

from pipeline.ingest import synthetic
from pipeline.ingest.files import ingest_files
from pipeline.ingest.open_store import open_store
from pipeline.refresh.refresher import Refresher
from pipeline.serving.lookup import TopK
from pipeline.serving.redis_client import as_client
from pipeline.settings import Settings
from pipeline.training import retrain
from pipeline.training.config import load_models

SHIPPED = Path(__file__).resolve().parents[2] / "dags" / "models.toml"
EVENTS = {"ads": lambda: synthetic.outcome_events(n_items=600, n_features=8, seed=1),
          "search": lambda: synthetic.judgment_events(n_queries=40, docs_per_query=10,
                                                      n_features=6, seed=1),
          "reviews": lambda: synthetic.ordinal_events(n_items=120, n_reviews=900, seed=1)}


@pytest.mark.filterwarnings("ignore::solvers.DegenerateFitWarning")
@pytest.mark.filterwarnings("ignore::solvers.ConvergenceWarning")
def test_models_with_nothing_to_fold_in_are_healed_by_their_refresher(tmp_path, redis_url,
                                                                        redis_client):
    settings = Settings(home=tmp_path / "home", namespace=f"h{tmp_path.name[-10:]}",
                        redis_url=redis_url)
    models = load_models(SHIPPED)
    for name, make in EVENTS.items():
        kind = models[name].kinds[0]
        ingest_files([synthetic.write_jsonl(make(), tmp_path / f"{name}.jsonl")], kind,
                     settings=settings, progress=False)
        run = retrain.run(name, models, settings=settings, redis_url=redis_url)
        assert run["decision"] == "published", (name, run.get("reason"))
    refreshers = {name: Refresher(name, models[name], settings,
                                  TopK(as_client(redis_url), namespace=settings.namespace,
                                       timeout=5.0), open_store(settings), redis_url=redis_url)
                  for name in EVENTS}
    for refresher in refreshers.values():
        assert refresher.watch() == "flipped"          # serving what was published
    redis_client.flushdb()
    with TopK(redis_url, namespace=settings.namespace) as topk:
        for name, refresher in refreshers.items():
            assert refresher.watch() == "healed", name
            assert refresher.stats.heals == 1 and refresher.stats.last_heal
            served = topk.served_version(name)
            # the version itself says it was a heal, and when, for /readyz and `models`
            assert served is not None and served.healed_at, name
    # /readyz, served over loopback HTTP from the same Redis, names the healed models
    import httpx

    from pipeline.serving.api import create_app
    from tests.serving.test_explain import serve_app

    with TopK(redis_url, namespace=settings.namespace) as topk, \
            serve_app(create_app(topk, models=list(EVENTS))) as base:
        body = httpx.get(f"{base}/readyz", timeout=10).json()
    assert body["status"] == "ready" and set(body["healed"]) == set(EVENTS), body
    # and a plain publish is not a heal
    retrain.run("ads", models, settings=settings, redis_url=redis_url, cold=True)
    with TopK(redis_url, namespace=settings.namespace) as topk:
        assert topk.served_version("ads").healed_at == ""
