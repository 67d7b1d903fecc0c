"""The event store, run directories and checkpoints on a real S3-compatible server
(infra/s3, SeaweedFS), as several hosts share them: writers fenced by the commit chain, two
``rankstream ingest`` processes with their own HOMEs on one topic, retrains on two "hosts"."""

from __future__ import annotations

import random
import signal
import time

import pyarrow as pa
import pytest

from pipeline.ingest.events import schema
from pipeline.ingest.local_store import LocalEventStore
from pipeline.ingest.object_store import ObjectEventStore
from pipeline.ingest.open_store import open_store
from pipeline.ingest.producer import EventProducer
from pipeline.ingest.store import OverlapError, copy_store
from pipeline.settings import Settings
from pipeline.storage import ObjectStore, StorageError
from tests.ingest.factory import cli_ingest, make_event, new_topic


def _ratings(first: int, last: int) -> pa.Table:
    return pa.Table.from_pylist(
        [{"event_id": f"e{i}", "ts": 1_700_000_000_000 + i, "offset": i, "user": f"u{i % 7}",
          "item": f"i{i % 11}", "rating": float(1 + i % 5)} for i in range(first, last + 1)],
        schema=schema("rating"))


def test_two_writers_racing_for_one_partition_store_it_once(store_url):
    a, b = ObjectEventStore(store_url), ObjectEventStore(store_url)
    a.write("r", 0, 0, 9, {"rating": _ratings(0, 9)})
    with pytest.raises(OverlapError, match="already holds offsets up to 9"):
        b.write("r", 0, 5, 14, {"rating": _ratings(5, 14)})
    # b believes the chain ends at 10 and races a for that position: exactly one commit wins
    b.write("r", 0, 10, 19, {"rating": _ratings(10, 19)})
    a._ends[("r", 0)] = 10
    with pytest.raises(OverlapError, match="another writer committed offsets from 10 first"):
        a.write("r", 0, 10, 24, {"rating": _ratings(10, 24)})
    reader = ObjectEventStore(store_url)
    ids = reader.read("rating").column("event_id").to_pylist()
    assert sorted(ids, key=lambda e: int(e[1:])) == [f"e{i}" for i in range(20)]
    assert reader.next_offsets() == {("r", 0): 20}
    assert reader.segments(complete=False) == []      # the loser deleted its files
    window = reader.read("rating", start_offsets={("r", 0): 5}, end_offsets={("r", 0): 15})
    assert window.num_rows == 10


def test_files_no_commit_names_are_invisible_and_old_ones_are_recovered(store_url):
    store = ObjectEventStore(store_url)
    store.write("r", 0, 0, 4, {"rating": _ratings(0, 4)})
    # a writer killed between its segment files and its commit
    import pyarrow.parquet as pq

    key = store.objects.key("store", "kind=rating", "topic=r", "partition=0",
                            f"{5:020d}-{9:020d}-dead-writer.parquet")
    pq.write_table(_ratings(5, 9), store.objects.fs_path(key), filesystem=store.filesystem)
    assert store.read("rating").num_rows == 5 and store.next_offsets() == {("r", 0): 5}
    assert [s.first for s in store.segments(complete=False)] == [5]
    assert store.recover("r", 0) == []                 # younger than an hour: left alone
    import pipeline.ingest.object_store as module

    old, module.ORPHAN_SECONDS = module.ORPHAN_SECONDS, -1.0
    try:
        assert store.recover("r", 0) == [key]
    finally:
        module.ORPHAN_SECONDS = old
    assert store.segments(complete=False) == []
    store.write("r", 0, 5, 9, {"rating": _ratings(5, 9)})
    assert store.read("rating").num_rows == 10


def test_a_local_store_copies_into_the_object_store_once(tmp_path, store_url):
    local = LocalEventStore(tmp_path / "store")
    local.write("r", 0, 0, 9, {"rating": _ratings(0, 9)})
    local.write("r", 1, 0, 4, {"rating": _ratings(100, 104)})
    remote = ObjectEventStore(store_url)
    assert copy_store(local, remote) == (2, 0)
    local.write("r", 0, 10, 19, {"rating": _ratings(10, 19)})
    assert copy_store(local, remote) == (1, 2)
    assert remote.next_offsets() == local.next_offsets() == {("r", 0): 20, ("r", 1): 5}
    assert sorted(remote.read("rating").column("event_id").to_pylist()) == \
        sorted(local.read("rating").column("event_id").to_pylist())
    stats = remote.stats()
    assert stats["kinds"]["rating"]["events"] == 25 and stats["unfinished_files"] == 0


def test_an_unreachable_or_missing_store_is_one_line(object_store_env):
    with pytest.raises(StorageError, match="bucket 'no-such-bucket' does not exist"):
        ObjectEventStore("s3://no-such-bucket/x").next_offsets()
    down = ObjectStore("s3://rankstream/x", environ={**object_store_env,
                                                     "AWS_ENDPOINT_URL": "http://127.0.0.1:9"})
    with pytest.raises(StorageError, match="cannot reach the object store"):
        down.list("x/")


def test_two_ingest_hosts_on_one_topic_store_every_event_once(kafka_bootstrap, tmp_path,
                                                              store_url):
    """Two ``rankstream ingest`` processes, each with its own HOME (two hosts), in one consumer
    group on one topic and one object-store store, and a third in a group of its own (a
    misconfigured host) that joins later, reads every partition and races the others for
    every flush. Each event is stored exactly once; both hosts of the group stored some."""
    topic = new_topic(kafka_bootstrap, partitions=3, prefix="s3ingest")
    rng, sent = random.Random(5), []
    store = ObjectEventStore(store_url)
    hosts: dict = {}

    def produce(first: int, last: int):
        with EventProducer(kafka_bootstrap, encoding="compact", batch_events=20) as producer:
            for i in range(first, last):
                event = make_event("rating", i, rng)
                producer.send(topic, event)
                sent.append(event["event_id"])
                if i % 500 == 499:
                    producer.flush()
                    time.sleep(0.2)

    def ingest(host: str, group: str):
        hosts[host] = cli_ingest(tmp_path / host, kafka_bootstrap, topic, "--kind", "rating",
                                 "--store", store_url, "--group", group,
                                 "--flush-interval", "0.5")

    def stored_all(timeout: float = 120) -> None:
        deadline = time.monotonic() + timeout
        while store.read("rating", topics=[topic], columns=["event_id"]).num_rows < len(sent):
            assert time.monotonic() < deadline, "the store did not get every event"
            for host, proc in hosts.items():
                assert proc.poll() is None, (tmp_path / host / "child.log").read_text()
            time.sleep(0.5)

    def writers() -> set[int]:
        import json

        import pyarrow.parquet as pq

        return {int(json.loads(pq.read_schema(seg.path, filesystem=store.filesystem)
                               .metadata[b"rankstream"])["writer"].split("-")[-2])
                for seg in store.segments(topics=[topic])}

    try:
        ingest("host1", "g")
        ingest("host2", "g")
        produce(0, 3000)
        stored_all()
        group = {hosts["host1"].pid, hosts["host2"].pid}
        assert writers() == group, f"writers {writers()}, the group's hosts {group}"
        ingest("rogue", "rogue")        # reads every partition from the store's end
        produce(3000, 6000)
        stored_all()
    finally:
        for proc in hosts.values():
            proc.send_signal(signal.SIGTERM)        # the processes this test started
        for proc in hosts.values():
            proc.wait(timeout=60)
    ids = ObjectEventStore(store_url).read("rating", columns=["event_id"]).column(
        "event_id").to_pylist()
    assert len(ids) == len(sent) == 6000 and set(ids) == set(sent)   # none lost, none twice


def test_a_retrain_on_another_host_warm_starts_from_the_first_hosts_checkpoint(
        tmp_path, store_url, redis_url):
    from pipeline.ingest import synthetic
    from pipeline.ingest.files import ingest_files
    from pipeline.training import retrain
    from pipeline.training.config import parse_model

    models = {"movies": parse_model("movies", {
        "algorithm": "altsvm", "kinds": ["rating"], "evaluation": {"holdout": 4},
        "params": {"rank": 8, "max_iter": 40, "n_threads": 1, "random_state": 0},
        "gate": {"if_trivial": "publish_trivial", "tolerance": 1.0}}, "test")}
    events = synthetic.rating_events(n_users=300, n_items=150, per_user=30, seed=1)
    local = Settings(home=tmp_path / "local")
    namespace = f"s3{tmp_path.name[-10:]}"
    host_a = Settings(home=tmp_path / "hostA", store=store_url, namespace=namespace)
    host_b = Settings(home=tmp_path / "hostB", store=store_url, namespace=namespace)
    remote = open_store(host_a)

    def add(part, name):
        path = synthetic.write_jsonl(part, tmp_path / f"{name}.jsonl")
        ingest_files([path], "rating", settings=local, progress=False)
        copy_store(open_store(local), remote)

    add(events[:6000], "a")
    first = retrain.run("movies", models, settings=host_a, redis_url=redis_url)
    assert first["decision"] == "published" and not first["train"]["warm_start"]
    add(events[6000:7000], "b")
    second = retrain.run("movies", models, settings=host_b, redis_url=redis_url)
    assert second["train"]["warm_start"], "host B did not warm-start from host A's checkpoint"
    assert second["dataset"]["warm_from"].endswith(first["dataset"]["run_key"])
    assert second["publish"]["version"] == first["publish"]["version"] + 1
    again = retrain.run("movies", models, settings=host_a, redis_url=redis_url)
    assert again["decision"] == "unchanged"              # host A sees host B's checkpoint
    objects = ObjectStore(store_url)
    runs = {o.key.split("/runs/movies/")[1].split("/")[0]
            for o in objects.list(objects.key("runs", "movies") + "/")}
    assert {first["dataset"]["run_key"], second["dataset"]["run_key"]} <= runs
    # the Airflow hand-over: a task on host B is given host A's run directory by URL
    from pipeline.training.run_store import open_run_store

    url = open_run_store(host_a).push_run(first["dataset"]["run_dir"])
    assert url.startswith("s3://")
    assert open_run_store(host_b).pull_run(url).joinpath("train.json").is_file()
    # a checkpoint whose upload was cut short (no COMMITTED marker) is never pulled
    objects.put(objects.key("checkpoints", "movies", "99990101T000000000000-cut", "manifest.json"),
                b"{}")
    host_c = Settings(home=tmp_path / "hostC", store=store_url, namespace=namespace)
    open_run_store(host_c).pull_checkpoints("movies")
    assert sorted(p.name for p in (host_c.checkpoint_dir / "movies").iterdir()) == sorted(
        [first["dataset"]["run_key"], second["dataset"]["run_key"]])
