"""Refresher tests against a real broker and redis-server."""

from pipeline.training.config import parse_model


def models() -> dict:
    """The small AltSVM ``movies`` config both refresh test files train and refresh."""
    spec = {"algorithm": "altsvm", "kinds": ["rating"],
            "params": {"rank": 8, "reg_ratio": 0.3, "item_bias": True, "max_iter": 30,
                       "tol": 1e-4, "random_state": 0, "n_threads": 1,
                       "comparisons": "implicit", "implicit_per_user": 200,
                       "implicit_min_rating": "relevance"},
            "evaluation": {"holdout": 4},
            "gate": {"tolerance": 1.0, "if_trivial": "publish_trivial"}}
    return {"movies": parse_model("movies", spec, "test")}


def published(settings, events: list, folder) -> tuple:
    """``events`` ingested from a file in ``folder``, :func:`models`' ``movies`` trained and
    published to ``settings.redis_url``, and a refresher of it (not started):
    ``(refresher, topk, models)``."""
    from pipeline.ingest import synthetic
    from pipeline.ingest.files import ingest_files
    from pipeline.ingest.open_store import open_store
    from pipeline.refresh.refresher import Refresher
    from pipeline.serving.lookup import TopK
    from pipeline.serving.redis_client import as_client
    from pipeline.training import retrain

    path = synthetic.write_jsonl(events, folder / "ratings.jsonl")
    ingest_files([path], "rating", settings=settings, progress=False)
    specs = models()
    run = retrain.run("movies", specs, settings=settings, redis_url=settings.redis_url)
    assert run["decision"] == "published", run.get("reason")
    topk = TopK(as_client(settings.redis_url), namespace=settings.namespace, timeout=5.0)
    refresher = Refresher("movies", specs["movies"], settings, topk, open_store(settings),
                          redis_url=settings.redis_url)
    return refresher, topk, specs
