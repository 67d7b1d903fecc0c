"""Files straight into an object store (``RANKSTREAM_STORE=s3://…``) on the real S3-compatible
server of infra/s3: ``rankstream store create-bucket`` makes the bucket a missing-bucket error
names; ``rankstream ingest --files`` writes there directly, content-tracked as on local disk
(again: nothing; edited: only what changed), and trains a model; a writer that loses the
commit race, or dies before its commit, has none of its record keys counted."""

from __future__ import annotations

import json
import uuid

import numpy as np
import pytest

from pipeline.cli import main
from pipeline.ingest import synthetic
from pipeline.ingest.files import ingest_files
from pipeline.ingest.ledger import FILE_TOPIC, record_key
from pipeline.ingest.object_store import ObjectEventStore, ObjectFileLedger
from pipeline.ingest.open_store import open_file_ledger, open_store
from pipeline.ingest.sources import plan_source, read_plan
from pipeline.settings import Settings
from pipeline.storage import ObjectStore
from pipeline.training import retrain
from pipeline.training.config import parse_model


def _letor(path, n_queries=12, seed=0):
    events = synthetic.judgment_events(n_queries=n_queries, docs_per_query=6, n_features=4,
                                       seed=seed, id_prefix=f"s{seed}")
    lines = [f"{e['label']} qid:{e['query']} "
             + " ".join(f"{i + 1}:{v:g}" for i, v in enumerate(e["features"]))
             + f" # docid = {e['doc']}" for e in events]
    path.write_text("".join(line + "\n" for line in lines))
    return path, lines


def _ingest(capsys, tmp_path, store_url, *files) -> dict:
    code = main(["ingest", "--files", *map(str, files), "--store", store_url, "--home",
                 str(tmp_path / "home"), "--no-progress", "--json"])
    out, err = capsys.readouterr()
    assert code == 0, err
    return json.loads(out)


def test_create_bucket_makes_the_bucket_a_missing_bucket_error_names(tmp_path, capsys,
                                                                    object_store_env):
    bucket = f"rs-{uuid.uuid4().hex[:12]}"
    url = f"s3://{bucket}/events"
    home = ["--home", str(tmp_path / "home")]
    assert main(["store", "stats", "--store", url, *home]) == 1
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and f"bucket {bucket!r} does not exist" in err
    assert f"`rankstream store create-bucket --store s3://{bucket}`" in err
    assert main(["store", "create-bucket", "--store", url, *home]) == 0
    assert f"created bucket {bucket!r}" in capsys.readouterr().out
    assert main(["store", "create-bucket", "--store", url, *home]) == 0
    assert "already exists" in capsys.readouterr().out
    assert main(["store", "stats", "--store", url, *home]) == 0
    capsys.readouterr()
    for args, says in ((["--store", "s3://Bad_Name/x"], "S3 takes 3 to 63 lowercase letters"),
                       ([], "create-bucket is for an object store")):
        assert main(["store", "create-bucket", *args, *home]) == 1
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and says in err, err


def test_files_go_straight_into_the_object_store_and_train(tmp_path, capsys, store_url):
    letor, lines = _letor(tmp_path / "train.txt")
    ratings = tmp_path / "ratings.csv"
    ratings.write_text("userId,movieId,rating,timestamp\n1,31,2.5,1260759144\n"
                       "1,1029,3.0,1260759179\n2,10,4.0,835355493\n")
    summary = _ingest(capsys, tmp_path, store_url, letor, ratings)
    assert summary["events"] == {"judgment": 72, "rating": 3}, summary
    store = open_store(Settings(home=tmp_path / "elsewhere", store=store_url))
    assert isinstance(store, ObjectEventStore)
    assert sorted(store.read("rating").column("ts").to_pylist()) == [
        835355493000, 1260759144000, 1260759179000]
    assert store.read("judgment").num_rows == 72
    objects = ObjectStore(store_url)
    assert objects.list(objects.key("store", "_files", "keys") + "/")      # the ledger is there
    again = _ingest(capsys, tmp_path / "host2", store_url, letor, ratings)   # another HOME
    assert again["events"] == {} and again["already_stored"] == 75
    label, rest = lines[3].split(" ", 1)
    lines[3] = f"{(int(label) + 1) % 3} {rest}"                          # one label changed
    letor.write_text("".join(line + "\n" for line in lines))
    edited = _ingest(capsys, tmp_path, store_url, letor)
    assert edited["events"] == {"judgment": 1} and edited["already_stored"] == 71
    assert edited["removed"] == [f"{letor}: 1"]

    settings = Settings(home=tmp_path / "trainer", store=store_url)
    spec = {"algorithm": "kernel_ranksvm", "kinds": ["judgment"], "params": {"n_threads": 1}}
    run = retrain.run("search", {"search": parse_model("search", spec, "test")},
                      settings=settings, publish=False)
    assert run["decision"] == "trained", run.get("reason")
    assert run["dataset"]["stats"]["judgments"] == 72 and \
        run["dataset"]["stats"]["replaced"] == 1


def test_a_writer_that_loses_the_race_is_told_and_nothing_is_stored_twice(tmp_path, store_url):
    first, _ = _letor(tmp_path / "a.txt", seed=1)
    second, _ = _letor(tmp_path / "b.txt", seed=2)
    settings = Settings(home=tmp_path / "home", store=store_url)
    winner, loser = ObjectEventStore(store_url), ObjectEventStore(store_url)
    ingest_files([first], settings=settings, store=winner, progress=False)
    loser._ends[(FILE_TOPIC, 0)] = 0     # it looked before the winner committed
    with pytest.raises(ValueError, match="another ingest wrote files into .* at the same time"
                                         ".*run this again"):
        ingest_files([second], settings=settings, store=loser, progress=False)
    assert ObjectFileLedger(winner).stored_keys(0).size == 72   # the loser's keys: not counted
    rerun = ingest_files([first, second], settings=settings, progress=False)
    assert rerun.events == {"judgment": 72} and rerun.already_stored == 72
    ids = open_store(settings).read("judgment").column("event_id").to_pylist()
    assert len(ids) == len(set(ids)) == 144


def test_keys_of_a_flush_that_never_committed_are_not_counted(tmp_path, store_url):
    path, _ = _letor(tmp_path / "train.txt", n_queries=3)
    plan = plan_source(path)
    keys = [record_key(plan.key() + content) for chunk in read_plan(plan)
            for content in chunk.contents]
    # a writer died between its keys and its commit: they name records that were never stored
    with open_file_ledger(ObjectEventStore(store_url)) as dead:
        dead.add(0, len(keys) - 1, keys)
    store = ObjectEventStore(store_url)
    with open_file_ledger(store) as ledger:
        assert isinstance(ledger, ObjectFileLedger) and ledger.stored_keys(0).size == 0
    summary = ingest_files([path], settings=Settings(home=tmp_path / "h", store=store_url),
                           store=store, progress=False)
    assert summary.events == {"judgment": 18}
    assert np.all(np.diff(ledger.stored_keys(0).astype(np.float64)) > 0)
    assert ledger.stored_keys(0).size == 18
