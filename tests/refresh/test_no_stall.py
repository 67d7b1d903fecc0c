"""A refresher whose partitions are taken away holds them again (issue 53, "no silent stalls"),
against a real Kafka broker and redis-server: a second member of its group joins (the
partitions are split) and leaves, then the topic is deleted and created again. After each, the
refresher holds every partition within :data:`DEADLINE` seconds and a user's new event reaches
their answer (source ``fresh``): it reads again, it does not only say it holds them."""

from __future__ import annotations

import threading
import time
import uuid

from pipeline.ingest import synthetic
from pipeline.ingest.open_store import open_store
from pipeline.ingest.producer import EventProducer
from pipeline.refresh.kafka_source import KafkaRefresh
from pipeline.refresh.refresher import Refresher
from pipeline.serving.lookup import TopK
from pipeline.serving.redis_client import as_client
from tests.ingest.factory import new_topic
from tests.refresh import models as refresh_models
from tests.refresh.test_many_refreshers import _published

PARTITIONS = 2
DEADLINE = 60.0


def _until(what: str, done) -> float:
    """Seconds until ``done()`` holds; fails past :data:`DEADLINE`."""
    started = time.monotonic()
    while not done():
        assert time.monotonic() - started < DEADLINE, f"{what} not within {DEADLINE:.0f} s"
        time.sleep(0.2)
    return time.monotonic() - started


def _holds_all(loop: KafkaRefresh, topic: str) -> bool:
    consumer = loop.consumer
    held = consumer.assignment() if consumer is not None else set()
    return {tp.partition for tp in held if tp.topic == topic} == set(range(PARTITIONS))


def _rated(producer, topic: str, user: str, item, topk: TopK) -> float:
    """Seconds until ``user``'s rating of ``item`` reaches their answer (source fresh)."""
    producer.send(topic, {"kind": "rating", "event_id": uuid.uuid4().hex,
                          "ts": int(time.time() * 1000), "user": user, "item": item,
                          "rating": 5.0}, "rating")
    producer.flush()
    return _until(f"{user}'s event reaching their answer",
                  lambda: topk.recommend("movies", user, k=5).source == "fresh")


def _recreate(bootstrap: str, topic: str) -> None:
    """Delete ``topic`` and create it again, with the same name and partition count. Where the
    broker auto-creates topics, any client's metadata request for the name in between makes it
    again with the broker's default partitions (seen 40 ms after a deletion); such a topic is
    deleted again. One made again by someone else with our count is as good as ours."""
    from kafka.admin import KafkaAdminClient, NewTopic
    from kafka.errors import TopicAlreadyExistsError

    admin = KafkaAdminClient(bootstrap_servers=bootstrap)

    def described() -> tuple:
        """(topic id, partition count) of ``topic`` now, or (None, 0) where it is gone."""
        found = [t for t in admin.describe_topics([topic]) if not t.get("error_code")]
        return (found[0].get("topic_id"), len(found[0]["partitions"])) if found else (None, 0)

    try:
        old, _ = described()
        admin.delete_topics([topic])
        started = time.monotonic()
        while True:    # deletion is asynchronous: create once the broker let the name go
            try:
                admin.create_topics([NewTopic(topic, PARTITIONS, 1)])
                return
            except TopicAlreadyExistsError:
                now, partitions = described()
                assert time.monotonic() - started < DEADLINE, \
                    f"{topic} was not made again: it holds {partitions} partitions"
                if now is not None and now != old:
                    if partitions == PARTITIONS:
                        return
                    admin.delete_topics([topic])     # auto-created with the default count
                    old = now
                time.sleep(0.5)
    finally:
        admin.close()


def test_a_refresher_holds_its_partitions_again_after_a_member_left_and_a_topic_came_back(
        tmp_path, redis_url, kafka_bootstrap):
    from kafka import KafkaConsumer

    models = refresh_models()
    events = synthetic.rating_events(n_users=60, n_items=40, per_user=20, seed=5)
    settings = _published(tmp_path, "alone", synthetic.write_jsonl(events, tmp_path / "r.jsonl"),
                          models, redis_url, kafka_bootstrap)
    topk = TopK(as_client(redis_url), namespace=settings.namespace, timeout=5.0)
    users, items = sorted({e["user"] for e in events}), sorted({e["item"] for e in events})
    topic = new_topic(kafka_bootstrap, partitions=PARTITIONS, prefix="rs.refresh.stall")
    group = f"rankstream.refresh.test-{uuid.uuid4().hex[:8]}"
    refresher = Refresher("movies", models["movies"], settings, topk, open_store(settings),
                          redis_url=redis_url)
    loop = KafkaRefresh(refresher, settings, batch_ms=100, topics={topic: "rating"},
                        group=group)
    thread = threading.Thread(target=loop.run, daemon=True)
    thread.start()
    # a producer that never has the broker auto-create the topic it sends to, once deleted
    producer = EventProducer(kafka_bootstrap, allow_auto_create_topics=False)
    try:
        _until("the refresher holding the topic", lambda: _holds_all(loop, topic))
        _rated(producer, topic, users[0], items[0], topk)

        # a second member joins: the partitions are split between the two; then it leaves
        other = KafkaConsumer(bootstrap_servers=kafka_bootstrap, group_id=group,
                              enable_auto_commit=False, heartbeat_interval_ms=250)
        other.subscribe([topic])
        try:
            started = time.monotonic()
            while not other.assignment():
                assert time.monotonic() - started < DEADLINE, "the second member got nothing"
                other.poll(timeout_ms=200)
            assert not _holds_all(loop, topic) or not other.assignment()
        finally:
            other.close()
        _until("the refresher holding the topic again after the member left",
               lambda: _holds_all(loop, topic))
        _rated(producer, topic, users[1], items[1], topk)

        # the topic deleted and created again: new partitions, offsets from 0
        _recreate(kafka_bootstrap, topic)
        _until("the refresher holding the re-created topic", lambda: _holds_all(loop, topic))
        _rated(producer, topic, users[2], items[2], topk)
    finally:
        producer.close()
        loop.stop.set()
        thread.join(30)
    assert not thread.is_alive(), "the refresher did not stop"


def test_a_refreshers_reader_never_has_its_deleted_topic_auto_created(tmp_path, kafka_bootstrap):
    """The broker auto-creates topics (``infra/kafka``); kafka-python 3.0.12 drops the
    consumer's ``allow_auto_create_topics=False`` (see ``never_auto_create``), so the deleted
    topic came back with one partition 40 ms later. The refresher's own consumer, polling,
    must leave it deleted."""
    from types import SimpleNamespace

    from kafka.admin import KafkaAdminClient

    from pipeline.settings import Settings

    topic = new_topic(kafka_bootstrap, partitions=PARTITIONS, prefix="rs.refresh.gone")
    settings = Settings(kafka_bootstrap=kafka_bootstrap)
    loop = KafkaRefresh(SimpleNamespace(model="movies"), settings, topics={topic: "rating"},
                        group=f"rankstream.refresh.test-{uuid.uuid4().hex[:8]}")
    loop.consumer = consumer = loop._consumer("gone-0")
    admin = KafkaAdminClient(bootstrap_servers=kafka_bootstrap)
    stop = threading.Event()

    def poll():
        while not stop.is_set():
            consumer.poll(timeout_ms=100)

    polling = threading.Thread(target=poll, daemon=True)
    polling.start()
    try:
        _until("the reader holding the topic", lambda: bool(consumer.assignment()))
        admin.delete_topics([topic])
        time.sleep(3.0)       # its metadata requests go on while the name is free
        left = [t for t in admin.describe_topics([topic]) if not t.get("error_code")]
        assert not left, f"{topic} came back with {len(left[0]['partitions'])} partition(s)"
    finally:
        stop.set()
        polling.join(10)
        consumer.close()
        admin.close()
