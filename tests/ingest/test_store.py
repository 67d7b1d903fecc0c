"""The event store: segment groups, crash leftovers, overlap fencing, windows, readers."""

from __future__ import annotations

import os

import pyarrow as pa
import pytest

from pipeline.ingest.dead_letters import DeadLetters, export_jsonl
from pipeline.ingest.events import schema
from pipeline.ingest.local_store import LocalEventStore
from pipeline.ingest.store import OverlapError, legacy_file_topic


def rating_table(offsets, ts0=0):
    rows = [{"event_id": f"e{o}", "ts": ts0 + o, "offset": o, "user": f"u{o % 3}",
             "item": f"i{o % 5}", "rating": float(o % 5)} for o in offsets]
    return pa.Table.from_pylist(rows, schema=schema("rating"))


def dead_table(topic, offsets):
    dead = DeadLetters()
    for o in offsets:
        dead.add(o, -1, "bad JSON: x", b"{")
    return dead.table(topic, 0)


@pytest.fixture
def store(tmp_path):
    return LocalEventStore(tmp_path / "store", tmp_path / "dead-letter")


def test_segment_names_carry_offsets_and_group_size(store):
    paths = store.write("r", 0, 0, 9, {"rating": rating_table(range(9))}, dead_table("r", [9]))
    names = sorted(p.name for p in paths)
    assert names == ["00000000000000000000-00000000000000000009-of2.parquet"] * 2
    assert paths[0].parent.parts[-3:] in {("kind=rating", "topic=r", "partition=0"),
                                          ("dead-letter", "topic=r", "partition=0")}
    assert store.next_offsets() == {("r", 0): 10}
    assert store.read("rating").num_rows == 9
    assert store.read_dead_letters().column("offset").to_pylist() == [9]
    assert not [p for p in (store.root / "kind=rating").rglob("*") if p.name.endswith(".tmp")]


def test_unfinished_group_is_invisible_and_removed(store):
    store.write("r", 0, 0, 4, {"rating": rating_table(range(5))})
    paths = store.write("r", 0, 5, 9, {"rating": rating_table(range(5, 9))},
                        dead_table("r", [9]))
    paths[1].unlink()                            # the crash hit between the two renames
    leftover = paths[0].parent / ".00000000000000000010-x.parquet.1234.tmp"
    leftover.write_bytes(b"partial")
    assert store.next_offsets() == {("r", 0): 5}
    assert store.read("rating").num_rows == 5
    assert len(store.segments(complete=False)) == 1
    removed = store.recover("r", 0)
    assert set(removed) == {paths[0], leftover}
    assert store.segments(complete=False) == []
    store.write("r", 0, 5, 12, {"rating": rating_table(range(5, 13))})
    assert store.read("rating").column("offset").to_pylist() == list(range(13))


def test_crash_between_renames_leaves_a_readable_store(store, monkeypatch):
    store.write("r", 0, 0, 4, {"rating": rating_table(range(5))})
    real_replace = os.replace
    calls = []

    def dying_replace(src, dst):
        calls.append(dst)
        if len(calls) == 2:
            raise KeyboardInterrupt("killed")     # stands in for SIGKILL mid-flush
        real_replace(src, dst)

    monkeypatch.setattr(os, "replace", dying_replace)
    with pytest.raises(KeyboardInterrupt):
        store.write("r", 0, 5, 9, {"rating": rating_table(range(5, 9))}, dead_table("r", [9]))
    monkeypatch.setattr(os, "replace", real_replace)
    assert store.next_offsets() == {("r", 0): 5}
    assert store.read("rating").num_rows == 5 and store.read_dead_letters().num_rows == 0
    store.write("r", 0, 5, 9, {"rating": rating_table(range(5, 9))}, dead_table("r", [9]))
    assert store.read("rating").num_rows == 9 and store.read_dead_letters().num_rows == 1


def test_overlapping_group_is_refused(store):
    store.write("r", 0, 0, 9, {"rating": rating_table(range(10))})
    with pytest.raises(OverlapError, match="starts at offset 5 but the store already holds "
                                           "offsets up to 9"):
        store.write("r", 0, 5, 14, {"rating": rating_table(range(5, 15))})
    store.write("r", 0, 12, 14, {"rating": rating_table(range(12, 15))})   # gaps are fine
    store.write("r", 1, 0, 0, {"rating": rating_table([0])})              # other partition
    assert store.next_offsets() == {("r", 0): 15, ("r", 1): 1}


def test_time_and_offset_windows(store):
    for first in range(0, 100, 10):
        store.write("a", 0, first, first + 9, {"rating": rating_table(range(first, first + 10),
                                                                      ts0=1000)})
    store.write("b", 0, 0, 9, {"rating": rating_table(range(10), ts0=5000)})
    offsets = store.read("rating", topics=["a"]).column("offset").to_pylist()
    assert offsets == list(range(100))
    window = store.read("rating", start_ts=1015, end_ts=1042, topics=["a"])
    assert window.column("ts").to_pylist() == list(range(1015, 1042))
    snapshot = {("a", 0): 55}
    part = store.read("rating", start_offsets={("a", 0): 23}, end_offsets=snapshot)
    assert part.column("offset").to_pylist() == list(range(23, 55))     # "b" not in snapshot
    both = store.read("rating", start_offsets={("a", 0): 95}, columns=["event_id", "user"])
    assert both.column_names == ["event_id", "user"] and both.num_rows == 5 + 10
    assert store.read("rating", start_ts=10**9).num_rows == 0
    assert store.read("judgment").schema == schema("judgment")


def test_stats_and_dead_letter_export(store, tmp_path):
    store.write("r", 0, 0, 9, {"rating": rating_table(range(9), ts0=86_400_000)},
                dead_table("r", [9]))
    stats = store.stats()
    assert stats["kinds"]["rating"]["events"] == 9
    assert stats["kinds"]["rating"]["min_ts"] == 86_400_000
    assert stats["kinds"]["dead_letter"]["events"] == 1
    assert stats["next_offsets"] == {"r/0": 10}
    out = tmp_path / "dead.jsonl"
    assert export_jsonl(store.read_dead_letters(), out) == 1
    assert '"raw_base64": "ew=="' in out.read_text()


def test_legacy_file_topic_is_stable_per_path(tmp_path):
    a = tmp_path / "u.data"
    assert legacy_file_topic(a) == legacy_file_topic(str(a))
    assert legacy_file_topic(a) != legacy_file_topic(tmp_path / "other" / "u.data")


# ---------------------------------------------------------------------- one interface, two siblings

def test_open_store_chooses_the_sibling_the_settings_name(tmp_path, monkeypatch):
    from pipeline.ingest.object_store import ObjectEventStore
    from pipeline.ingest.open_store import open_store
    from pipeline.settings import Settings

    local = open_store(Settings(home=tmp_path))
    assert type(local) is LocalEventStore
    assert (local.root, local.dead_letter_root) == (tmp_path / "store", tmp_path / "dead-letter")
    assert local.filesystem is None
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:9")     # no request is made
    remote = open_store(Settings(home=tmp_path, store="s3://events/prod"), compression="zstd")
    assert type(remote) is ObjectEventStore and remote.compression == "zstd"
    assert (remote.root, remote.dead_letter_root) == ("s3://events/prod/store",
                                                      "s3://events/prod/dead-letter")


def test_the_stores_are_siblings_behind_an_abstract_base():
    import ast
    import inspect

    from pipeline.ingest import store as base
    from pipeline.ingest.object_store import ObjectEventStore
    from pipeline.ingest.store import EventStore

    assert issubclass(LocalEventStore, EventStore) and issubclass(ObjectEventStore, EventStore)
    assert not issubclass(LocalEventStore, ObjectEventStore)
    assert not issubclass(ObjectEventStore, LocalEventStore)
    with pytest.raises(TypeError, match="abstract"):
        EventStore(writer="w")
    assert not hasattr(ObjectEventStore, "lock")       # its commits fence writers, not a lock
    imported = {node.module for node in ast.walk(ast.parse(inspect.getsource(base)))
                if isinstance(node, ast.ImportFrom)}
    assert not imported & {"pipeline.ingest.local_store", "pipeline.ingest.object_store",
                           "pipeline.ingest.open_store"}


def test_one_object_store_and_one_client_per_location_and_server():
    from pipeline.storage import ObjectStore, object_store_for

    env = {"AWS_ENDPOINT_URL": "http://127.0.0.1:9", "AWS_ACCESS_KEY_ID": "k",
           "AWS_SECRET_ACCESS_KEY": "secret"}
    first = object_store_for("s3://events/prod", env)
    assert object_store_for("s3://events/prod/", env) is first
    assert object_store_for("s3://events/other", env) is not first
    assert object_store_for("s3://events/prod", {**env, "AWS_ENDPOINT_URL": "http://h:1"}) \
        is not first
    assert first.client is first.client and first.fs is first.fs      # built once
    assert "secret" not in repr(first) and "secret" not in repr(first.connection)

    class WithStore:
        store = "s3://events/prod"

    assert object_store_for(WithStore(), env) is first
    with pytest.raises(ValueError, match="not an object-store URL"):
        object_store_for("/data/rankstream", env)
    assert isinstance(first, ObjectStore) and first.key("a", "b") == "prod/a/b"
