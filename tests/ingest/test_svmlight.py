"""SVMlight / LIBSVM / LETOR files through ``rankstream ingest --files`` into the store and a
trained model: LETOR lines with ``qid`` are judgments (``search``), LIBSVM binary lines are
outcomes (``ads``), multiclass lines are ordinal events (``reviews``); odd lines are dead letters
with a reason; labels that do not fit the kind refuse the file in one line; an edited file adds
only what changed."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest

from pipeline.cli import main
from pipeline.ingest import synthetic
from pipeline.ingest.open_store import open_store
from pipeline.ingest.sources import detect_format
from pipeline.ingest.svmlight import MAX_LINE_BYTES
from pipeline.settings import Settings
from pipeline.training import retrain
from pipeline.training.config import parse_model
from pipeline.training.trainers.kernel_ranksvm import instance_ids, judgments


def _letor_lines(events) -> list[str]:
    """LETOR lines (features 1-based, the doc id in the comment) of judgment events."""
    return [f"{e['label']} qid:{e['query']} "
            + " ".join(f"{i + 1}:{v:g}" for i, v in enumerate(e["features"]))
            + f" # docid = {e['doc']} inc = 1" for e in events]


def _libsvm_lines(events) -> list[str]:
    """LIBSVM binary lines (+1 / -1, features 1-based) of outcome events."""
    return [("+1" if e["label"] else "-1") + " "
            + " ".join(f"{int(i) + 1}:{v:g}" for i, v in sorted(e["features"].items(),
                                                                 key=lambda kv: int(kv[0])))
            for e in events]


def _write(path, lines):
    path.write_text("".join(line + "\n" for line in lines))
    return path


def _cli(capsys, settings, *args) -> tuple[int, dict | str]:
    code = main(["ingest", "--files", *map(str, args), "--home", str(settings.home),
                 "--no-progress", "--json"])
    out, err = capsys.readouterr()
    return code, (json.loads(out) if code == 0 else err)


@pytest.fixture
def settings(tmp_path):
    return Settings(home=tmp_path / "home")


def _model(name, spec):
    return {name: parse_model(name, spec, "test")}


def test_a_letor_file_trains_the_search_model(tmp_path, settings, capsys):
    events = synthetic.judgment_events(n_queries=40, docs_per_query=8, n_features=5, seed=2)
    path = _write(tmp_path / "train.txt", ["# MQ2007-style judgments", ""]
                  + _letor_lines(events))
    assert detect_format(path) == "svmlight"            # .txt: told by its first line
    code, summary = _cli(capsys, settings, path)
    assert code == 0 and summary["events"] == {"judgment": 320}, summary
    assert summary["dead_letters"] == {}
    stored = {(r["query"], r["doc"]): r for r in open_store(settings).read("judgment").to_pylist()}
    first = events[0]
    row = stored[(first["query"], first["doc"])]
    assert row["label"] == first["label"] and row["feature_index"] == [1, 2, 3, 4, 5]
    assert np.allclose(row["feature_value"], first["features"], atol=1e-5)
    assert row["ts"] == int(os.stat(path).st_mtime * 1000)         # the file's time
    assert row["event_id"].startswith("svm-")

    spec = {"algorithm": "kernel_ranksvm", "kinds": ["judgment"], "params": {"n_threads": 1},
            "gate": {"tolerance": 0.02}}
    run = retrain.run("search", _model("search", spec), settings=settings, publish=False)
    assert run["decision"] == "trained", run.get("reason")
    assert run["dataset"]["stats"]["judgments"] == 320
    assert run["train"]["metrics"]["ndcg@10"] > 0


def test_docs_without_ids_are_their_position_within_the_query(tmp_path, settings, capsys):
    path = _write(tmp_path / "q.svm", ["2 qid:7 1:1", "0 qid:8 1:0", "1 qid:7 1:0.5",
                                       "0 qid:7 1:0.1 # d-x"])
    assert _cli(capsys, settings, path)[1]["events"] == {"judgment": 4}
    docs = {(r["query"], r["doc"]): r["label"]
            for r in open_store(settings).read("judgment").to_pylist()}
    assert docs == {("7", "1"): 2, ("8", "1"): 0, ("7", "2"): 1, ("7", "d-x"): 0}


def test_a_libsvm_binary_file_trains_the_ads_model(tmp_path, settings, capsys):
    events = synthetic.outcome_events(n_items=400, n_features=20, positive_rate=0.1, seed=4)
    path = _write(tmp_path / "a9a", _libsvm_lines(events))
    code, summary = _cli(capsys, settings, path)            # ±1 labels: outcome, no --kind
    assert code == 0 and summary["events"] == {"outcome": 400}, summary
    rows = open_store(settings).read("outcome").to_pylist()
    assert sorted(r["label"] for r in rows) == sorted(e["label"] for e in events)   # -1 is 0
    assert {r["item"] for r in rows} == {f"a9a:{n}" for n in range(1, 401)}   # name:line
    spec = {"algorithm": "toppush", "kinds": ["outcome"], "params": {"max_features": 100}}
    run = retrain.run("ads", _model("ads", spec), settings=settings, publish=False)
    assert run["decision"] == "trained", run.get("reason")
    assert run["dataset"]["stats"]["outcomes"] == 400
    assert run["dataset"]["stats"]["positives"] == sum(e["label"] for e in events)


def test_a_multiclass_file_is_ordinal_and_trains_the_reviews_model(tmp_path, settings, capsys):
    events = synthetic.ordinal_events(n_items=80, n_reviews=300, text=False, seed=5)
    lines = [f"{e['label']} " + " ".join(f"{int(i) + 1}:{v:g}" for i, v in
                                         sorted(e["features"].items(), key=lambda kv: int(kv[0])))
             + f" # {e['item']}" for e in events]
    path = _write(tmp_path / "reviews.libsvm", lines)
    code, summary = _cli(capsys, settings, path)            # 1..5: ordinal, no --kind
    assert code == 0 and summary["events"] == {"ordinal": 300}, summary
    rows = open_store(settings).read("ordinal").to_pylist()
    assert len({r["event_id"] for r in rows}) == 300        # an item's reviews stay apart
    assert {r["item"] for r in rows} == {e["item"] for e in events}
    spec = {"algorithm": "npsvor", "kinds": ["ordinal"],
            "params": {"tol": 0.01, "random_state": 0, "text_features": 0}}
    run = retrain.run("reviews", _model("reviews", spec), settings=settings, publish=False)
    assert run["decision"] == "trained", run.get("reason")


def test_odd_lines_are_dead_letters_with_a_reason(tmp_path, settings, capsys):
    long_line = "1 qid:1 " + "1:1 " * (MAX_LINE_BYTES // 4 + 10)    # over 1 MiB
    lines = ["# a comment", "", "   ", "2 qid:1 1:0.5 2:1 # docid = ok",
             "1 qid:1 1:abc", "1 qid:1 1:nan", "1 qid:1 1:inf 2:1e999", "1 qid:1 3:1 3:2",
             "1 qid:1 99999999999999999999:1", "1 qid:1 16777216:1", "1 qid:1 -3:1",
             "1 qid:1 garbage", "1 qid:1 2:1 qid:2", "1 2:1", "x qid:1 1:1", "1.5 qid:1 1:1",
             "1 qid: 1:1", long_line, "\x1c", "0 qid:1 1:1 # docid = last"]
    path = tmp_path / "odd.svmlight"
    raw = "".join(line + "\n" for line in lines).encode()
    raw += b"1 qid:1 1:\xff\n"                               # not ASCII before the comment
    path.write_bytes(raw)
    code, summary = _cli(capsys, settings, path)
    assert code == 0 and summary["events"] == {"judgment": 2}, summary
    store = open_store(settings)
    assert sorted(store.read("judgment").column("doc").to_pylist()) == ["last", "ok"]
    reasons = store.read_dead_letters().column("reason").to_pylist()
    expected = [
        "value at index 1 is 'abc', expected a number",
        "value at index 1 is nan, expected a finite number",
        "value at index 1 is inf, expected a finite number",
        "svmlight line 8: index 3 appears twice",
        "index '99999999999999999999' > 16777215, the limit",
        "index 16777216 > 16777215, the limit",
        "index -3 < 0",
        "svmlight line 12: 'garbage' is not INDEX:VALUE",
        "svmlight line 13: 'qid:2': qid must come right after the label",
        "svmlight line 14: no qid: (or an empty one) in a file of judgments",
        "field 'label' is 'x', expected an integer",
        "field 'label' is 1.5, expected an integer",
        "svmlight line 17: no qid: (or an empty one)",
        f"svmlight line 18: longer than {MAX_LINE_BYTES:,} bytes",
        "svmlight line 19: no qid:",
        "svmlight line 21: a byte that is not ASCII before the comment",
    ]
    assert len(reasons) == len(expected), reasons
    for part in expected:
        assert any(part in reason for reason in reasons), (part, reasons)
    dead = store.read_dead_letters().to_pylist()
    assert max(len(d["raw"]) for d in dead) <= 4096         # the long line is not kept whole


@pytest.mark.parametrize("lines, kind, says", [
    (["3 1:1", "1 2:1"], "outcome", "--kind outcome takes labels ±1 or 0/1, and the file has "
                                    "labels 1, 3 (label 3 on line 1): pass --kind ordinal"),
    (["-1 1:1", "0 2:1", "1 1:1"], "outcome", "(label 0 on line 2, label -1 on line 1): one "
                                              "of the two conventions"),
    (["0 1:1", "1 2:1"], "ordinal", "--kind ordinal takes integer labels from 1"),
    (["1 1:1", "2 2:1"], None, "labels 1, 2 could be two classes or two grades: pass --kind "
                               "ordinal"),
    (["0 1:1", "2 1:1", "1 1:1"], None, "fit neither outcome events"),
    (["0.5 1:1", "2 2:1"], None, "label 0.5 on line 1 is not an integer"),
    (["x 1:1"], None, "no line starts with a number label"),
    (["1 qid:1 1:1"], "outcome", "its lines have qid: (LETOR), so they are judgment events"),
    (["1 1:1", "-1 1:2"], "judgment", "no line has a qid:, which judgments need"),
    (["1 1:1", "-1 1:2"], "rating", "are outcome or ordinal events, not rating"),
])
def test_labels_that_do_not_fit_the_kind_refuse_the_file_in_one_line(tmp_path, settings,
                                                                      capsys, lines, kind, says):
    path = _write(tmp_path / "labels.svm", lines)
    code, err = _cli(capsys, settings, path, *(["--kind", kind] if kind else []))
    assert code == 2 and len(err.strip().splitlines()) == 1 and says in err, err
    assert open_store(settings).next_offsets() == {}        # nothing stored


def test_an_edited_file_adds_only_what_changed(tmp_path, settings, capsys):
    events = synthetic.judgment_events(n_queries=10, docs_per_query=6, n_features=3, seed=1)
    lines = _letor_lines(events)
    path = _write(tmp_path / "train.txt", lines)
    assert _cli(capsys, settings, path)[1]["events"] == {"judgment": 60}
    changed = events[5]
    label = (changed["label"] + 1) % 3
    lines[5] = lines[5].replace(f"{changed['label']} qid:", f"{label} qid:", 1)
    lines.append(f"2 qid:{events[0]['query']} 1:0.5 2:0.5 3:0.5 # docid = appended")
    _write(path, lines)
    os.utime(path, (os.stat(path).st_atime, os.stat(path).st_mtime + 5))  # edited later
    code, summary = _cli(capsys, settings, path)
    assert code == 0 and summary["events"] == {"judgment": 2}, summary
    assert summary["already_stored"] == 59 and summary["removed"] == [f"{path}: 1"]
    data = judgments(open_store(settings), test_fraction=0.0)
    assert data.stats["judgments"] == 61 and data.stats["replaced"] == 1    # latest wins
    row = np.flatnonzero(data.instance == instance_ids(data.queries.lookup([changed["query"]]),
                                                        data.docs.lookup([changed["doc"]])))
    assert row.size == 1 and data.label[row[0]] == label
    assert _cli(capsys, settings, path)[1]["events"] == {}  # again: nothing new
    ids = open_store(settings).read("judgment").column("event_id").to_pylist()
    assert len(set(ids)) == 61                              # the changed line kept its id


def test_repeated_lines_are_each_an_event_and_items_are_named_by_file(tmp_path, settings,
                                                                      capsys):
    lines = ["+1 1:1", "+1 1:1", "-1 2:1", "-1 2:1 # c7", "-1 2:1 # c7"]
    path = _write(tmp_path / "dups.svm", lines)
    assert _cli(capsys, settings, path)[1]["events"] == {"outcome": 5}
    items = sorted(open_store(settings).read("outcome").column("item").to_pylist())
    assert items == ["c7", "c7", "dups.svm:1", "dups.svm:2", "dups.svm:3"]
    assert _cli(capsys, settings, path)[1]["already_stored"] == 5
    # another file's rows without ids are its own items (a9a and a9a.t); named ones are shared
    code, summary = _cli(capsys, settings, _write(tmp_path / "dups.svm.t", lines))
    assert code == 0 and summary["events"] == {"outcome": 3} and summary["already_stored"] == 2


def test_compressed_files_are_read_as_they_are(tmp_path, settings, capsys):
    import bz2
    import gzip

    text = "".join(f"{1 + i % 2} qid:{i // 4} 1:{i} 2:0.5 # docid = d{i}\n" for i in range(12))
    (tmp_path / "train.txt.gz").write_bytes(gzip.compress(text.encode()))
    (tmp_path / "vali.txt.bz2").write_bytes(bz2.compress(text.replace("qid:", "qid:v").encode()))
    code, summary = _cli(capsys, settings, tmp_path / "train.txt.gz", tmp_path / "vali.txt.bz2")
    assert code == 0 and summary["events"] == {"judgment": 24}, summary


def test_real_letor_and_libsvm_files(tmp_path, settings, capsys, shared_data):
    letor = shared_data / "letor4-mq2008" / "Fold1" / "vali.txt.gz"
    binary = shared_data / "libsvm-diabetes" / "diabetes"
    code, summary = _cli(capsys, settings, letor, binary)
    assert code == 0 and summary["dead_letters"] == {}, summary
    assert summary["events"]["outcome"] == 768
    store = open_store(settings)
    judged = store.read("judgment").to_pylist()
    assert len(judged) == summary["events"]["judgment"] > 2000
    assert all(r["doc"].startswith("GX") for r in judged)          # the LETOR docids
    assert max(max(r["feature_index"]) for r in judged) == 46       # MQ2008's 46 features
