"""Several refreshers of one model against a real Kafka broker and redis-server: with events
keyed by user, a backlog drained by one refresher and by two (in one consumer group, over a
4-partition topic) leaves every touched user with the same list; a refresher that takes over
partitions rebuilds their users' histories from the store and the topic (issue 53)."""

from __future__ import annotations

import threading
import time
import uuid

import numpy as np

from pipeline.ingest import synthetic
from pipeline.ingest.files import ingest_files
from pipeline.ingest.open_store import open_store
from pipeline.ingest.producer import EventProducer
from pipeline.refresh.kafka_source import KafkaRefresh
from pipeline.refresh.refresher import Refresher
from pipeline.serving.lookup import TopK
from pipeline.serving.redis_client import as_client
from pipeline.settings import Settings
from pipeline.training import retrain
from tests.ingest.factory import new_topic
from tests.refresh import models as refresh_models

PARTITIONS = 4
DEADLINE = 90.0


def _published(tmp_path, name: str, path, models, redis_url, kafka_bootstrap) -> Settings:
    """A home and namespace of their own with the events of ``path`` ingested, and the
    version a retrain of them published."""
    settings = Settings(home=tmp_path / name, namespace=f"{name}{uuid.uuid4().hex[:8]}",
                        kafka_bootstrap=kafka_bootstrap, redis_url=redis_url)
    ingest_files([path], "rating", settings=settings, progress=False)
    run = retrain.run("movies", models, settings=settings, redis_url=redis_url)
    assert run["decision"] == "published", run.get("reason")
    return settings


def _drained(group: str, topic: str, bootstrap: str, ends: dict) -> bool:
    """Whether ``group`` committed every partition of ``topic`` up to its end (a refresher
    commits a batch's offsets after it wrote the batch's lists); read by a consumer that
    names the group without joining it."""
    from kafka import KafkaConsumer, TopicPartition

    reader = KafkaConsumer(bootstrap_servers=bootstrap, group_id=group,
                           enable_auto_commit=False)
    try:
        return all((reader.committed(TopicPartition(topic, p)) or -1) >= end
                   for p, end in ends.items())
    finally:
        reader.close()


def _drain(settings: Settings, models, topic: str, ends: dict, members: int,
           group: str | None = None) -> None:
    """Run ``members`` refreshers of ``movies`` in one consumer group (of their own unless
    ``group`` names one) until the group committed the whole topic, then stop them."""
    topk = TopK(as_client(settings.redis_url), namespace=settings.namespace, timeout=5.0)
    group = group or f"rankstream.refresh.test-{uuid.uuid4().hex[:8]}"
    loops, threads = [], []
    for _ in range(members):
        refresher = Refresher("movies", models["movies"], settings, topk, open_store(settings),
                              redis_url=settings.redis_url)
        loop = KafkaRefresh(refresher, settings, batch_ms=100, topics={topic: "rating"},
                            group=group)
        loops.append(loop)
        threads.append(threading.Thread(target=loop.run, daemon=True))
        threads[-1].start()
    try:
        started = time.monotonic()
        while not _drained(group, topic, settings.kafka_bootstrap, ends):
            assert time.monotonic() - started < DEADLINE, \
                f"{members} refresher(s) did not drain the backlog in {DEADLINE:.0f} s"
            time.sleep(0.5)
    finally:
        for loop in loops:
            loop.stop.set()
        for thread in threads:
            thread.join(30)
    assert not any(t.is_alive() for t in threads), "a refresher did not stop"


def test_a_backlog_drained_by_one_refresher_or_by_two_leaves_every_user_the_same_list(
        tmp_path, redis_url, kafka_bootstrap):
    models = refresh_models()
    events = synthetic.rating_events(n_users=200, n_items=120, per_user=25, seed=3)
    path = synthetic.write_jsonl(events, tmp_path / "ratings.jsonl")
    one = _published(tmp_path, "one", path, models, redis_url, kafka_bootstrap)
    two = _published(tmp_path, "two", path, models, redis_url, kafka_bootstrap)
    client = as_client(redis_url)
    readers = {name: TopK(client, namespace=s.namespace, timeout=5.0)
               for name, s in (("one", one), ("two", two))}
    # the same version in both namespaces: a retrain is deterministic
    states = {n: r.versions.current_state("movies") for n, r in readers.items()}
    factors = [readers[n].lists.factors(states[n]) for n in ("one", "two")]
    assert np.array_equal(factors[0][0], factors[1][0])

    # the backlog: known users (some with many events, spread over every partition) and
    # users the version never met, their events keyed by user as `rankstream produce` sends
    topic = new_topic(kafka_bootstrap, partitions=PARTITIONS, prefix="rs.refresh.many")
    rng = np.random.default_rng(7)
    users = sorted({e["user"] for e in events})
    touched = [users[i] for i in rng.choice(len(users), 60, replace=False)]
    touched += [f"new-{n}" for n in range(8)]
    items = sorted({e["item"] for e in events})
    producer = EventProducer(kafka_bootstrap)
    try:
        for n in range(600):
            user = touched[int(rng.integers(len(touched)))]
            producer.send(topic, {"kind": "rating", "event_id": uuid.uuid4().hex,
                                  "ts": int(time.time() * 1000) + n, "user": user,
                                  "item": items[int(rng.integers(len(items)))],
                                  "rating": float(rng.integers(1, 6))}, "rating")
        producer.flush()
        spread = {producer.partition_of(topic, str(u).encode()) for u in touched}
    finally:
        producer.close()
    assert spread == set(range(PARTITIONS)), spread
    from kafka import KafkaConsumer, TopicPartition

    consumer = KafkaConsumer(bootstrap_servers=kafka_bootstrap)
    try:
        ends = {tp.partition: o for tp, o in consumer.end_offsets(
            [TopicPartition(topic, p) for p in range(PARTITIONS)]).items()}
    finally:
        consumer.close()
    assert sum(ends.values()) == 600

    _drain(one, models, topic, ends, members=1)
    _drain(two, models, topic, ends, members=2)

    differ = []
    for user in touched:
        lists = {n: r.recommend("movies", user, k=10) for n, r in readers.items()}
        assert lists["one"].source == "fresh", (user, lists["one"].source)
        if [i for i, _ in lists["one"].items] != [i for i, _ in lists["two"].items]:
            differ.append(user)
    assert not differ, f"{len(differ)} of {len(touched)} users got another list from two " \
                       f"refreshers: {differ[:5]}"


def _ends(bootstrap: str, topic: str, partitions: int) -> dict:
    from kafka import KafkaConsumer, TopicPartition

    consumer = KafkaConsumer(bootstrap_servers=bootstrap)
    try:
        return {tp.partition: o for tp, o in consumer.end_offsets(
            [TopicPartition(topic, p) for p in range(partitions)]).items()}
    finally:
        consumer.close()


def test_the_next_owner_of_a_partition_rebuilds_its_users_histories_from_the_topic(
        tmp_path, redis_url, kafka_bootstrap):
    """A refresher drains its users' events and leaves; the next member of the group, a
    process that never saw them (the store does not hold them: ingest is behind), takes the
    partitions and one more event per user: every user's list is then the fold-in of their
    whole history (the store's events and every event sent), not of the last event alone."""
    from pipeline.refresh.events import Event, stored_events
    from pipeline.refresh.refresher import user_factor

    models = refresh_models()
    events = synthetic.rating_events(n_users=200, n_items=120, per_user=25, seed=5)
    settings = _published(tmp_path, "handover", synthetic.write_jsonl(
        events, tmp_path / "ratings.jsonl"), models, redis_url, kafka_bootstrap)
    topk = TopK(as_client(redis_url), namespace=settings.namespace, timeout=5.0)
    topic = new_topic(kafka_bootstrap, partitions=2, prefix="rs.refresh.handover")
    group = f"rankstream.refresh.test-{uuid.uuid4().hex[:8]}"
    rng = np.random.default_rng(11)
    users = sorted({e["user"] for e in events})[:20]
    items = sorted({e["item"] for e in events})
    sent: dict = {}
    producer = EventProducer(kafka_bootstrap)
    try:
        def send(user, n):
            item, ts = items[int(rng.integers(len(items)))], int(time.time() * 1000) + n
            producer.send(topic, {"kind": "rating", "event_id": uuid.uuid4().hex, "ts": ts,
                                  "user": user, "item": item, "rating": 5.0}, "rating")
            sent.setdefault(str(user), []).append(Event("rating", item, None, 5.0, ts, 0))

        for n in range(100):                     # the first owner's: 5 a user
            send(users[n % len(users)], n)
        producer.flush()
        _drain(settings, models, topic, _ends(kafka_bootstrap, topic, 2), 1, group)
        for n, user in enumerate(users):         # the next owner's: one more each
            send(user, 1000 + n)
        producer.flush()
    finally:
        producer.close()
    _drain(settings, models, topic, _ends(kafka_bootstrap, topic, 2), 1, group)

    st = topk.versions.current_state("movies")
    V, b = topk.lists.factors(st)
    stored = stored_events(open_store(settings), ["rating"])
    wrong = []
    for user in users:
        key = str(user)
        factor, seen = user_factor(st, (V, b), stored.get(key, []) + sent[key], st.fold_in,
                                   key)
        scores = V @ factor + (0 if b is None else b)
        scores[seen] = -np.inf
        want = [st.item_ids[i] for i in np.argsort(-scores, kind="stable")[:10]]
        got = topk.recommend("movies", user, k=10)
        if got.source != "fresh" or [i for i, _ in got.items] != want:
            wrong.append(user)
    assert not wrong, f"{len(wrong)} of {len(users)} users' lists are not their whole " \
                      f"history's fold-in after the hand-over: {wrong[:5]}"


def test_two_refreshers_hold_each_their_partitions_users_until_a_stray_event(
        tmp_path, redis_url, kafka_bootstrap):
    """Two refreshers in one group over a 4-partition topic, keyed by user: each holds the
    stored histories of the users its partitions hash (disjoint, together every user), not
    the whole store. An event of a user hashed elsewhere (a producer that does not key by
    user) makes the refresher that read it hold every user's history from then on."""
    from pipeline.refresh.ownership import partitions_of
    from pipeline.serving.layout import key_of

    models = refresh_models()
    events = synthetic.rating_events(n_users=120, n_items=80, per_user=20, seed=13)
    settings = _published(tmp_path, "owners", synthetic.write_jsonl(
        events, tmp_path / "ratings.jsonl"), models, redis_url, kafka_bootstrap)
    everyone = {key_of(e["user"]) for e in events}
    topic = new_topic(kafka_bootstrap, partitions=PARTITIONS, prefix="rs.refresh.owners")
    topk = TopK(as_client(redis_url), namespace=settings.namespace, timeout=5.0)
    group = f"rankstream.refresh.test-{uuid.uuid4().hex[:8]}"
    loops = [KafkaRefresh(Refresher("movies", models["movies"], settings, topk,
                                    open_store(settings), redis_url=redis_url),
                          settings, batch_ms=100, topics={topic: "rating"}, group=group)
             for _ in range(2)]
    threads = [threading.Thread(target=loop.run, daemon=True) for loop in loops]
    for thread in threads:
        thread.start()
    refreshers = [loop.refresher for loop in loops]

    def settled(check) -> bool:
        started = time.monotonic()
        while time.monotonic() - started < DEADLINE:
            if check():
                return True
            time.sleep(0.5)
        return False

    try:
        assert settled(lambda: all(r.ownership is not None and r.state is not None
                                   and r.history.users() for r in refreshers)), \
            [(r.ownership and r.ownership.describe(), r.state) for r in refreshers]
        held = [r.history.users() for r in refreshers]
        for r, users in zip(refreshers, held):
            mine = r.ownership.assigned[topic]
            assert {int(p) for p in partitions_of(sorted(users), PARTITIONS)} <= mine, \
                f"a refresher of partitions {sorted(mine)} holds users hashed elsewhere"
        assert held[0].isdisjoint(held[1]), sorted(held[0] & held[1])[:5]
        assert held[0] | held[1] == everyone, sorted(everyone - held[0] - held[1])[:5]
        assert [r.stats.users_held for r in refreshers] == [len(h) for h in held]

        user = sorted(held[0])[0]          # one of the first's users, sent to the second
        wrong = min(refreshers[1].ownership.assigned[topic])
        producer = EventProducer(kafka_bootstrap)
        try:
            producer.send(topic, {"kind": "rating", "event_id": uuid.uuid4().hex,
                                  "ts": int(time.time() * 1000), "user": user,
                                  "item": events[0]["item"], "rating": 4.0}, "rating",
                          partition=wrong)
            producer.flush()
        finally:
            producer.close()
        assert settled(lambda: refreshers[1].stats.unkeyed and refreshers[1].ownership is None
                       and refreshers[1].history.users() == everyone), \
            (refreshers[1].stats.unkeyed, len(refreshers[1].history.users()))
        assert f"{topic}/{wrong}" in refreshers[1].stats.unkeyed
    finally:
        for loop in loops:
            loop.stop.set()
        for thread in threads:
            thread.join(30)
