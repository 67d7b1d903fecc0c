"""§3 of the adversarial review: values that passed validation and poisoned a model later,
and a publish failure that left a checkpoint claiming the run had published."""

from __future__ import annotations

import pytest

from pipeline.ingest import synthetic
from pipeline.ingest.files import ingest_files
from pipeline.ingest.open_store import open_store
from pipeline.serving.lookup import TopK
from pipeline.settings import Settings
from pipeline.training import retrain
from pipeline.training.config import parse_model

MODELS = {
    "movies": {"algorithm": "altsvm", "kinds": ["rating"], "window": {"last_days": 30},
               "params": {"rank": 4, "item_bias": True, "comparisons": "mixed",
                          "random_state": 0, "n_threads": 1},
               "evaluation": {"holdout": 2},
               # these tests are about what ingest and publish do, not about quality: on 60
               # users whether the model beats popularity is a coin toss of the sampling
               "gate": {"tolerance": 1.0, "trivial_margin": -1.0}},
    "ads": {"algorithm": "toppush", "kinds": ["outcome"], "params": {"max_features": 100}},
}


def _models(**changes):
    return {name: parse_model(name, {**spec, **changes.get(name, {})}, "test")
            for name, spec in MODELS.items()}


@pytest.fixture
def settings(tmp_path, redis_client):
    return Settings(home=tmp_path / "home", namespace=f"odd{tmp_path.name[-10:]}")


def _ingest(settings, events, kind, name="e"):
    path = synthetic.write_jsonl(events, settings.home / "in" / f"{name}.jsonl")
    return ingest_files([path], kind, settings=settings, progress=False)


def _ratings(**kw):
    return synthetic.rating_events(n_users=60, n_items=40, per_user=15, seed=3, **kw)


def test_an_event_from_the_year_9999_is_a_dead_letter_not_the_end_of_every_window(
        settings, redis_url):
    events = _ratings()
    events.append({**events[0], "event_id": "far-future", "ts": "9999-12-31T00:00:00Z"})
    summary = _ingest(settings, events, "rating")
    assert sum(summary.dead_letters.values()) == 1
    reason = open_store(settings).read_dead_letters()["reason"][0].as_py()
    assert "after" in reason and "RANKSTREAM_MAX_FUTURE_SECONDS" in reason
    out = retrain.run("movies", _models(), settings=settings, redis_url=redis_url)
    assert out["decision"] == "published", out.get("reason")


def test_ids_the_layout_cannot_carry_are_refused_at_ingest(settings, redis_url):
    events = _ratings()
    events[5] = {**events[5], "user": "\u0000"}
    events[6] = {**events[6], "item": "a\u0000b"}
    summary = _ingest(settings, events, "rating")
    assert sum(summary.dead_letters.values()) == 2
    out = retrain.run("movies", _models(), settings=settings, redis_url=redis_url)
    assert out["decision"] == "published"
    with TopK(redis_url, namespace=settings.namespace) as topk:
        assert topk.recommend("movies", events[0]["user"], k=3).version == 1


def test_a_failed_publish_leaves_no_checkpoint_and_the_next_run_publishes(
        settings, redis_url, monkeypatch):
    import pipeline.serving.publish as P

    _ingest(settings, _ratings(), "rating")
    real = P.publish

    def broken(*args, **kwargs):
        raise ConnectionError("Redis went away mid-publish")

    monkeypatch.setattr(P, "publish", broken)
    with pytest.raises(ConnectionError):
        retrain.run("movies", _models(), settings=settings, redis_url=redis_url)
    assert not (settings.checkpoint_dir / "movies").exists()
    monkeypatch.setattr(P, "publish", real)
    out = retrain.run("movies", _models(), settings=settings, redis_url=redis_url)
    assert out["decision"] == "published", out.get("reason")
    with TopK(redis_url, namespace=settings.namespace) as topk:
        assert topk.recommend("movies", _ratings()[0]["user"], k=3).version == 1


def test_feature_indices_are_bounded_at_ingest_and_per_model(settings, redis_url):
    outcomes = synthetic.outcome_events(n_items=600, n_features=20, seed=4)
    outcomes[0]["features"] = {str(2**31 - 1): 1.0, "3": 0.5}
    summary = _ingest(settings, outcomes, "outcome")
    reason = open_store(settings).read_dead_letters()["reason"][0].as_py()
    assert sum(summary.dead_letters.values()) == 1
    assert "index 2147483647 > 16777215, the limit" in reason
    # a deployment that allows big indices still bounds each model (max_features = 100)
    wide = Settings(home=settings.home, namespace=settings.namespace,
                    max_feature_index=2**31 - 1)
    outcomes[1]["features"] = {str(2**31 - 2): 1.0, "4": 0.5}
    outcomes[1]["event_id"] += "-again"
    outcomes[1]["ts"] += 10_000_000   # the item's latest outcome
    _ingest(wide, [outcomes[1]], "outcome", "wide")
    out = retrain.run("ads", _models(), settings=wide, redis_url=redis_url)
    assert out["decision"] == "published"
    stats = out["dataset"]["stats"]
    assert stats["features"] <= 100 and stats["feature_values_over_max_features"] == 1


def test_a_bot_with_thousands_of_ratings_is_capped_and_the_report_says_so(settings, redis_url):
    events = _ratings()
    bot = [{"event_id": f"bot-{i}", "ts": events[-1]["ts"] + i, "user": "bot",
            "item": f"m{i % 40}-{i}", "rating": 1 + i % 5} for i in range(3000)]
    _ingest(settings, events + bot, "rating")
    out = retrain.run("movies", _models(), settings=settings, redis_url=redis_url)
    stats = out["dataset"]["stats"]
    assert stats["max_pairs_per_user"] == 10_000
    assert stats["comparisons_dropped_explicit"] > 3_000_000  # the bot's ~3.6M pairs, capped
    assert stats["comparisons_dropped_implicit"] >= 19_000    # and its ~30,000 implicit ones
    assert stats["comparisons"] < 60 * (105 + 150) + 2 * 10_000  # the others', plus the caps
