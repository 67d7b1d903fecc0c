"""A topic deleted and created again restarts its offsets at 0: its events are stored as a new
generation beside the old ones, the run says so, and none is lost (real broker)."""

from __future__ import annotations

import time

import pytest

from pipeline.ingest.kafka import ingest_kafka, new_group_id
from pipeline.ingest.open_store import open_store
from pipeline.ingest.producer import EventProducer
from tests.ingest.factory import settings_for

pytestmark = pytest.mark.kafka


def _events(prefix: str, n: int) -> list[dict]:
    return [{"kind": "rating", "event_id": f"{prefix}{i}", "ts": 1_700_000_000_000 + i,
             "user": f"u{i % 5}", "item": f"i{i}", "rating": 1 + i % 5} for i in range(n)]


def _recreate(bootstrap: str, topic: str) -> None:
    from kafka.admin import KafkaAdminClient, NewTopic
    from kafka.errors import TopicAlreadyExistsError

    admin = KafkaAdminClient(bootstrap_servers=bootstrap)
    try:
        admin.delete_topics([topic])
        for _ in range(100):     # deletion completes asynchronously
            try:
                admin.create_topics([NewTopic(topic, 1, 1)])
                return
            except TopicAlreadyExistsError:
                time.sleep(0.2)
        raise RuntimeError(f"{topic} could not be created again")
    finally:
        admin.close()


def test_a_recreated_topic_is_stored_as_a_new_generation(kafka_bootstrap, tmp_path):
    from tests.ingest.factory import new_topic

    topic = new_topic(kafka_bootstrap, prefix="recreated")
    settings = settings_for(tmp_path / "home", kafka_bootstrap)

    def ingest():
        return ingest_kafka({topic: "rating"}, settings=settings, group_id=new_group_id(),
                            until_end=True, progress=False, flush_interval=0.2)

    with EventProducer(kafka_bootstrap) as producer:
        producer.send_many(topic, _events("old-", 30))
    first = ingest()
    assert first.events["rating"] == 30 and not first.recreated
    _recreate(kafka_bootstrap, topic)
    with EventProducer(kafka_bootstrap) as producer:
        producer.send_many(topic, _events("new-", 10))
    second = ingest()
    assert second.events["rating"] == 10, str(second)     # never "0 events" from 10 messages
    assert second.recreated == [f"{topic}/0 -> {topic}~g2"]
    assert "RE-CREATED" in str(second)
    ids = open_store(settings).read("rating").column("event_id").to_pylist()
    assert sorted(ids) == sorted(e["event_id"] for e in _events("old-", 30) + _events("new-", 10))
    with EventProducer(kafka_bootstrap) as producer:      # the next run resumes in the new one
        producer.send_many(topic, _events("more-", 5))
    third = ingest()
    assert third.events["rating"] == 5 and not third.recreated
