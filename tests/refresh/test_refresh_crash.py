"""The refresher under faults, against a real Kafka broker and redis-server:

- a refresher **process** SIGKILLed mid-stream and started again loses no event's effect: once
  it has caught up, every user's list excludes every item they met and is the fold-in over their
  whole history (the store's events plus every event produced to the stream);
- **Redis emptied** (FLUSHDB: what a restart without persistence leaves) while the refresher
  runs: the model is served again within 30 s (the last checkpoint republished, one heal in the
  stats), users refreshed before it are fresh again, and new events refresh users as before.

The refresher process is this module's :func:`child` (run with ``sys.executable -c``) on a
topic of the test's own, so no other test's events reach it.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

import numpy as np
import pytest

from pipeline.ingest import synthetic
from pipeline.ingest.files import ingest_files
from pipeline.ingest.open_store import open_store
from pipeline.refresh.events import Event, stored_events
from pipeline.refresh.kafka_source import KafkaRefresh
from pipeline.refresh.refresher import Refresher, user_factor
from pipeline.serving.layout import key_of
from pipeline.serving.lookup import TopK
from pipeline.serving.redis_client import as_client
from pipeline.settings import Settings
from pipeline.training import retrain
from tests.ingest.factory import new_topic
from tests.refresh import models

REPO = Path(__file__).resolve().parents[2]
DEADLINE = 30.0
K = 10
MISMATCH: list = []




def child(argv: list[str]) -> None:
    """The refresher process: ``HOME NAMESPACE BOOTSTRAP REDIS_URL TOPIC``; SIGTERM stops it."""
    import logging

    home, namespace, bootstrap, url, topic = argv
    logging.basicConfig(level=logging.INFO, format="%(asctime)s child %(message)s")
    settings = Settings(home=Path(home), namespace=namespace, kafka_bootstrap=bootstrap,
                        redis_url=url)
    topk = TopK(as_client(url), namespace=namespace, timeout=5.0)
    refresher = Refresher("movies", models()["movies"], settings, topk, open_store(settings),
                          redis_url=url)
    loop = KafkaRefresh(refresher, settings, batch_ms=100, topics={topic: "rating"})
    signal.signal(signal.SIGTERM, lambda *_: loop.stop.set())
    loop.run()


CHILD = ("import sys; from tests.refresh.test_refresh_crash import child; "
         "child(sys.argv[1:])")


@pytest.fixture
def published(tmp_path, redis_client, redis_url, kafka_bootstrap):
    """A published AltSVM version of ``movies`` (its events ingested from a file), a topic of
    this test's own, and a producer that records what it sent."""
    from kafka import KafkaProducer

    settings = Settings(home=tmp_path / "home", namespace=f"c{uuid.uuid4().hex[:10]}",
                        kafka_bootstrap=kafka_bootstrap, redis_url=redis_url)
    events = synthetic.rating_events(n_users=200, n_items=120, per_user=25, seed=3)
    ingest_files([synthetic.write_jsonl(events, tmp_path / "ratings.jsonl")], "rating",
                 settings=settings, progress=False)
    run = retrain.run("movies", models(), settings=settings, redis_url=redis_url)
    assert run["decision"] == "published", run.get("reason")
    topk = TopK(as_client(redis_url), namespace=settings.namespace, timeout=5.0)
    producer = KafkaProducer(bootstrap_servers=kafka_bootstrap, acks="all", linger_ms=2)
    t = {"settings": settings, "topk": topk, "events": events, "path": tmp_path,
         "topic": new_topic(kafka_bootstrap, prefix="rs.crash"), "producer": producer,
         "sent": {}, "redis": redis_client}
    yield t
    producer.close(timeout=10)
    topk.close()


def send(t, user, item, rating) -> None:
    """Produce one rating and remember it (with its offset) as part of ``user``'s history."""
    ts = int(time.time() * 1000)
    event = {"kind": "rating", "event_id": uuid.uuid4().hex, "ts": ts, "user": user,
             "item": item, "rating": rating}
    meta = t["producer"].send(t["topic"], json.dumps(event).encode()).get(timeout=30)
    t["sent"].setdefault(user, []).append(
        Event("rating", item, None, float(rating), ts, meta.offset))


def until(what, deadline=DEADLINE, why="the condition"):
    started = time.monotonic()
    while time.monotonic() - started < deadline:
        got = what()
        if got:
            return got
        time.sleep(0.1)
    why = why() if callable(why) else why
    pytest.fail(f"{why} not within {deadline} s (last mismatch: user, source, version, "
                f"answer, expected: {MISMATCH})")


def expected_list(t, user) -> tuple[list, set]:
    """The fold-in over ``user``'s whole history (the store's events and every event sent)
    against the current version: its top-K item ids, and the items the user met."""
    topk = t["topk"]
    st = topk.versions.current_state("movies")
    events = stored_events(open_store(t["settings"]), ["rating"]).get(key_of(user), []) + \
        t["sent"].get(user, [])
    factor, seen = user_factor(st, topk.lists.factors(st), events, st.fold_in, key_of(user))
    V, b = topk.lists.factors(st)
    scores = (np.asarray(V, np.float32) @ factor).astype(np.float32)
    if b is not None:
        scores = scores + np.asarray(b, np.float32)
    scores[seen] = -np.inf
    ranked = np.argsort(-scores, kind="stable")[:K]
    return [st.item_ids[i] for i in ranked], {e.item for e in events}


def settled(t, users) -> dict | None:
    """Each user's answer once every one is fresh and is its whole-history fold-in, else None."""
    out = {}
    for user in users:
        rec = t["topk"].recommend("movies", user, k=K)
        want, _ = expected_list(t, user)
        if rec.source != "fresh" or [i for i, _ in rec.items] != want:
            MISMATCH[:] = [user, rec.source, rec.version, [i for i, _ in rec.items], want]
            return None
        out[user] = rec
    return out


def start_child(t, log_name: str) -> subprocess.Popen:
    s = t["settings"]
    out = open(t["path"] / log_name, "ab")
    try:
        return subprocess.Popen(
            [sys.executable, "-c", CHILD, str(s.home), s.namespace, s.kafka_bootstrap,
             s.redis_url, t["topic"]], cwd=REPO, stdout=out, stderr=subprocess.STDOUT,
            # member slots of its own: another refresher of a model "movies" on this machine
            # must not change the restarted child's static member id (it would wait 45 s for
            # the dead one's session to expire)
            env={**os.environ, "PYTHONPATH": str(REPO), "XDG_STATE_HOME": str(t["path"] / "xdg")},
            start_new_session=True)
    finally:
        out.close()


def is_our_child(proc: subprocess.Popen, topic: str) -> bool:
    """Whether ``proc.pid`` is still the refresher process this test started."""
    try:
        cmdline = Path(f"/proc/{proc.pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return False
    return (proc.poll() is None and CHILD.encode() in cmdline
            and topic.encode() in cmdline)


def stop_child(proc: subprocess.Popen, topic: str) -> None:
    if is_our_child(proc, topic):
        os.kill(proc.pid, signal.SIGTERM)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait()


def test_a_refresher_killed_mid_stream_and_restarted_loses_no_events_effect(published):
    t = published
    topk = t["topk"]
    known = list(dict.fromkeys(e["user"] for e in t["events"]))[:10]
    newbies = [f"new-{uuid.uuid4().hex[:6]}" for _ in range(2)]
    # each user meets items of their own list (so every event moves it), a new user items of
    # a known user's list; no (user, item) twice: the history's latest-wins has nothing to
    # break ties on
    plan = {u: [i for i, _ in topk.recommend("movies", u, k=12).items] for u in known}
    for n, u in enumerate(newbies):
        plan[u] = list(plan[known[n]])
    users = list(plan)

    def phase(lo, hi, pause=0.0, stop_after=None):
        for j in range(lo, hi):
            for n, u in enumerate(users):
                send(t, u, plan[u][j], rating=1 + (n + j) % 5)
                if stop_after is not None and stop_after():
                    return
            time.sleep(pause)

    proc = start_child(t, "refresh-1.log")
    try:
        phase(0, 4)          # the child applies these once it serves the version
        until(lambda: all(not set(plan[u][:4]) & {i for i, _ in
                                                   topk.recommend("movies", u, k=K).items}
                          and topk.recommend("movies", u, k=K).source == "fresh"
                          for u in users), why="the first events' effect")
        phase(4, 8, pause=0.15)    # the child applies and commits some of these ...
        assert is_our_child(proc, t["topic"]), "the refresher process is not ours any more"
        os.kill(proc.pid, signal.SIGKILL)      # ... and dies mid-stream
        assert proc.wait(10) == -signal.SIGKILL
        phase(8, 12)               # produced while no refresher runs
        proc = start_child(t, "refresh-2.log")
        final = until(lambda: settled(t, users), why="every user's whole-history fold-in")
    finally:
        stop_child(proc, t["topic"])
    for u, rec in final.items():
        _, met = expected_list(t, u)
        assert not met & {i for i, _ in rec.items}, f"{u}: a met item came back"
        assert len(rec.items) == K


@pytest.fixture
def running(published, monkeypatch):
    """A refresher of the published version in a thread, on the test's topic (member slots of
    its own, as the child's)."""
    t = published
    monkeypatch.setenv("XDG_STATE_HOME", str(t["path"] / "xdg"))
    refresher = Refresher("movies", models()["movies"], t["settings"], t["topk"],
                          open_store(t["settings"]), redis_url=t["settings"].redis_url)
    loop = KafkaRefresh(refresher, t["settings"], batch_ms=100, topics={t["topic"]: "rating"})
    thread = threading.Thread(target=loop.run, daemon=True)
    thread.start()
    t["refresher"] = refresher
    yield t
    loop.stop.set()
    thread.join(30)
    assert not thread.is_alive(), "the refresher did not stop"


def test_redis_emptied_while_the_refresher_runs_heals_and_users_are_fresh_again(running):
    t = running
    topk, refresher = t["topk"], t["refresher"]
    users = list(dict.fromkeys(e["user"] for e in t["events"]))
    before, after = users[:3], users[3:6]
    plan = {u: [i for i, _ in topk.recommend("movies", u, k=6).items] for u in users[:6]}
    for u in before:
        for item in plan[u][:3]:
            send(t, u, item, rating=5)
    until(lambda: settled(t, before),
          why=lambda: f"the first users' fresh answers (stats {refresher.stats.to_json()})")
    assert refresher.stats.heals == 0
    old = topk.versions.current_state("movies")

    t["redis"].flushdb()           # what a redis-server restarted without persistence holds
    emptied = time.monotonic()
    served = until(lambda: _served(topk), why="the model served again")
    healed_in = time.monotonic() - emptied
    assert healed_in < 30.0
    until(lambda: refresher.stats.heals == 1, why="the heal in the stats")
    assert served.publish_id != old.publish_id
    # users refreshed before Redis was emptied are fresh again (their streamed events replayed)
    again = until(lambda: settled(t, before), why="the earlier users fresh again")
    assert all(r.version == served.version for r in again.values())
    # and users with events after the heal are refreshed as before
    for u in after:
        for item in plan[u][:3]:
            send(t, u, item, rating=4)
    fresh = until(lambda: settled(t, after), why="users refreshed after the heal")
    for u, rec in {**again, **fresh}.items():
        _, met = expected_list(t, u)
        assert not met & {i for i, _ in rec.items}, f"{u}: a met item came back"
    assert refresher.stats.heals == 1


def _served(topk):
    from pipeline.serving.layout import UnknownModelError

    try:
        return topk.versions.current_state("movies")
    except UnknownModelError:
        return None
