"""The pipeline's metrics against real parts: ingest lag from a real Kafka broker moves as
events arrive and are stored, dead letters are counted by reason, and a real retrain's outcome
is what `rankstream metrics` exports (parsed with the Prometheus text parser)."""

from __future__ import annotations

import random
import subprocess
import sys

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from pipeline.ingest import synthetic
from pipeline.ingest.files import ingest_files
from pipeline.ingest.kafka import ingest_kafka
from pipeline.ingest.producer import EventProducer
from pipeline.settings import Settings
from pipeline.training import retrain
from pipeline.training.config import parse_model
from pipeline.training.pipeline_gauges import PipelineCollector, reason_class
from tests.ingest.factory import REPO, make_event, new_topic, settings_for


def _scrape(collector) -> dict:
    registry = CollectorRegistry()
    registry.register(collector)
    out = {}
    for family in text_string_to_metric_families(generate_latest(registry).decode()):
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def _send(bootstrap: str, topic: str, start: int, n: int, bad: int = 0) -> None:
    rng = random.Random(start)
    with EventProducer(bootstrap, encoding="json") as producer:
        for i in range(start, start + n):
            producer.send(topic, make_event("rating", i, rng))
        for i in range(bad):
            producer.send_raw(topic, b"{oops" if i % 2 else b'{"kind": "rating"}')


def test_ingest_lag_moves_with_kafka_and_the_store(tmp_path, kafka_bootstrap):
    topic = new_topic(kafka_bootstrap)
    settings = settings_for(tmp_path / "home", kafka_bootstrap)
    ingest = dict(kind="rating", settings=settings, until_end=True, progress=False)
    _send(kafka_bootstrap, topic, 0, 30, bad=4)
    ingest_kafka([topic], **ingest)
    collector = PipelineCollector(settings, [])
    first = _scrape(collector)
    at = (("partition", "0"), ("topic", topic))
    assert first[("rankstream_store_end_offset", at)] == 34
    assert first[("rankstream_ingest_lag", at)] == 0
    assert first[("rankstream_kafka_up", ())] == 1
    dead = {k[1][0][1]: v for k, v in first.items() if k[0] == "rankstream_dead_letters"}
    assert sum(dead.values()) == 4 and len(dead) == 2, dead

    _send(kafka_bootstrap, topic, 30, 25)
    assert _scrape(collector)[("rankstream_ingest_lag", at)] == 25
    ingest_kafka([topic], **ingest)
    after = _scrape(collector)
    assert after[("rankstream_ingest_lag", at)] == 0
    assert after[("rankstream_store_end_offset", at)] == 59


def test_kafka_down_is_a_zero_not_a_failed_scrape(tmp_path):
    settings = settings_for(tmp_path / "home", "127.0.0.1:1")
    path = synthetic.write_jsonl(synthetic.rating_events(n_users=5, n_items=5, per_user=2,
                                                         seed=0), tmp_path / "r.jsonl")
    ingest_files([path], "rating", settings=settings, progress=False)
    scraped = _scrape(PipelineCollector(settings, []))
    assert scraped[("rankstream_kafka_up", ())] == 0
    assert not any(k[0] == "rankstream_ingest_lag" for k in scraped)


def test_a_retrain_outcome_is_exported_by_the_cli(tmp_path, redis_url, redis_client):
    settings = Settings(home=tmp_path / "home", namespace=f"pm{tmp_path.name[-10:]}")
    path = synthetic.write_jsonl(synthetic.rating_events(n_users=120, n_items=60, per_user=20,
                                                         seed=3), tmp_path / "r.jsonl")
    ingest_files([path], "rating", settings=settings, progress=False)
    models = {"movies": parse_model("movies", {
        "algorithm": "altsvm", "kinds": ["rating"],
        "params": {"rank": 4, "reg_ratio": 0.3, "max_iter": 20, "random_state": 0,
                   "n_threads": 1}, "evaluation": {"holdout": 3}}, "test")}
    run = retrain.run("movies", models, settings=settings, redis_url=redis_url)
    out = subprocess.run([sys.executable, "-m", "pipeline.cli", "metrics", "--home",
                          str(settings.home)], cwd=REPO, capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr
    got = {}
    for family in text_string_to_metric_families(out.stdout):
        for s in family.samples:
            got[(s.name, tuple(sorted(s.labels.items())))] = s.value
    decision = run["decision"]
    assert got[("rankstream_last_retrain", (("decision", decision), ("model", "movies")))] == 1
    assert sum(v for k, v in got.items() if k[0] == "rankstream_last_retrain") == 1
    assert got[("rankstream_last_retrain_seconds", (("model", "movies"),))] == pytest.approx(
        run["seconds"], abs=1e-3)
    assert got[("rankstream_last_retrain_timestamp_seconds", (("model", "movies"),))] > 1.7e9


def test_reason_classes_are_bounded():
    assert reason_class("ts is 0: epoch milliseconds, not seconds") == "ts is 0"
    assert reason_class("") == "unknown" and len(reason_class("x" * 500)) == 80


def test_metrics_on_a_taken_port_is_one_line(tmp_path):
    import socket

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        out = subprocess.run([sys.executable, "-m", "pipeline.cli", "metrics", "--port",
                              str(port), "--home", str(tmp_path)], cwd=REPO,
                             capture_output=True, text=True, timeout=60)
    assert out.returncode == 1 and len(out.stderr.strip().splitlines()) == 1, out.stderr
    assert "cannot listen on" in out.stderr
