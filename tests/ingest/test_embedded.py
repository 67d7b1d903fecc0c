"""Embedded source: the same validation and store fed from files, idempotent re-ingestion."""

from __future__ import annotations

import csv
import json
import random
import subprocess
import sys

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from pipeline.ingest.files import ingest_files
from pipeline.ingest.open_store import open_store
from pipeline.ingest.sources import convert_movielens
from pipeline.ingest.validate import check_event
from pipeline.settings import Settings
from pipeline.training.arrays import to_numpy
from tests.ingest.factory import REPO, make_event


def write_jsonl(path, lines):
    path.write_text("".join(line + "\n" for line in lines), encoding="utf-8")


def test_jsonl_valid_and_bad_lines_and_idempotence(tmp_path):
    rng = random.Random(3)
    events = [make_event(rng.choice(["rating", "judgment", "ordinal"]), i, rng)
              for i in range(300)]
    lines = [json.dumps(e, ensure_ascii=False) for e in events]
    lines[10] = '{"kind": "rating", "event_id": "broken"'
    lines[20] = json.dumps({**events[20], "kind": "click"})
    lines.insert(30, "")                                        # blank lines are skipped
    path = tmp_path / "events.jsonl"
    write_jsonl(path, lines)
    settings = Settings(home=tmp_path / "home")
    first = ingest_files([path], settings=settings, chunk_size=64, progress=False)
    assert sum(first.events.values()) == 298 and sum(first.dead_letters.values()) == 2
    assert first.flushes == 5
    again = ingest_files([path], settings=settings, progress=False)
    assert sum(again.events.values()) == 0 and again.flushes == 0

    more = [make_event("rating", i, rng, tag="more") for i in range(5)]
    write_jsonl(path, lines + [json.dumps(e) for e in more])     # the file grew
    grown = ingest_files([path], settings=settings, progress=False)
    assert grown.events == {"rating": 5}

    store = open_store(settings)
    stored = sorted(sum((store.read(k).column("event_id").to_pylist()
                         for k in ("rating", "judgment", "ordinal")), []))
    expected = sorted(e["event_id"] for i, e in enumerate(events) if i not in (10, 20))
    assert stored == sorted(expected + [e["event_id"] for e in more])
    dead = store.read_dead_letters().to_pylist()
    assert [d["offset"] for d in dead] == [10, 20]
    assert dead[0]["reason"].startswith("bad JSON: ")
    assert dead[1]["reason"].startswith("unknown kind 'click'")
    assert dead[0]["raw"] == lines[10].encode()


def test_csv_with_header_converts_numbers_and_features(tmp_path):
    path = tmp_path / "judgments.csv"
    with open(path, "w", newline="", encoding="utf-8") as fh:
        writer = csv.writer(fh)
        writer.writerow(["event_id", "ts", "query", "doc", "label", "features"])
        writer.writerow(["j1", "1700000000000", "q1", "d1", "2", '{"5": 0.5, "1": 2}'])
        writer.writerow(["j2", "2023-11-14T22:13:20Z", "q1", "007", "0", "[1, 2.5]"])
        writer.writerow(["j3", "1700000000000", "q1", "d3", "high", "[1]"])
        writer.writerow(["j4", "1700000000000", "q1", "", "1", "[1]"])
    settings = Settings(home=tmp_path / "home")
    summary = ingest_files([path], kind="judgment", settings=settings, progress=False)
    assert summary.events == {"judgment": 2}
    table = open_store(settings).read("judgment")
    rows = {r["event_id"]: r for r in table.to_pylist()}
    assert rows["j1"]["feature_index"] == [1, 5] and rows["j1"]["label"] == 2
    assert rows["j2"]["doc"] == "007" and rows["j2"]["ts"] == 1_700_000_000_000
    reasons = open_store(settings).read_dead_letters().column("reason")
    assert reasons.to_pylist() == ["judgment: field 'label' is 'high', expected an integer",
                                   "judgment: missing field 'doc'"]


def test_parquet_source_dense_sparse_and_json_features(tmp_path):
    rows = [{"kind": "outcome", "event_id": f"o{i}", "ts": 1_700_000_000_000 + i,
             "item": f"i{i}", "label": i % 2} for i in range(30)]
    dense = pa.Table.from_pylist([{**r, "features": [1.0, float(i)]}
                                  for i, r in enumerate(rows[:10])])
    sparse_type = pa.map_(pa.int32(), pa.float64())
    sparse = pa.Table.from_pylist([{**r, "features": [(7, 1.0), (2, 0.5)]} for r in rows[10:20]],
                                  schema=dense.schema.set(5, pa.field("features", sparse_type)))
    text = pa.Table.from_pylist([{**r, "features": '{"3": 1}'} for r in rows[20:29]]
                                + [{**rows[29], "features": "not json"}])
    settings = Settings(home=tmp_path / "home")
    paths = []
    for name, table in (("dense", dense), ("sparse", sparse), ("text", text)):
        paths.append(tmp_path / f"{name}.parquet")
        pq.write_table(table, paths[-1])
    summary = ingest_files(paths, settings=settings, progress=False)
    assert summary.events == {"outcome": 29}
    store = open_store(settings)
    stored = {r["event_id"]: r for r in store.read("outcome").to_pylist()}
    assert stored["o1"]["feature_value"] == [1.0, 1.0]
    assert stored["o10"]["feature_index"] == [2, 7]
    assert stored["o20"]["feature_index"] == [3]
    assert store.read_dead_letters().column("reason").to_pylist() == [
        "outcome: field 'features' is 'not json', expected a list or a map"]


def test_movielens_u_data(tmp_path, shared_data):
    u_data = shared_data / "movielens-100k" / "u.data"
    settings = Settings(home=tmp_path / "home")
    summary = ingest_files([u_data], settings=settings, progress=False)
    assert summary.events == {"rating": 100_000} and not summary.dead_letters
    arrays = to_numpy(open_store(settings).read("rating"))
    assert len(set(arrays["user"])) == 943 and len(set(arrays["item"])) == 1682
    assert arrays["ts"].min() == 874_724_710_000             # seconds became milliseconds
    assert ingest_files([u_data], settings=settings, progress=False).flushes == 0
    converted = tmp_path / "ml.jsonl"
    assert convert_movielens(u_data, converted) == 100_000
    assert check_event(json.loads(converted.open().readline())) is None


def test_cli_ingest_files_and_store_stats(tmp_path):
    rng = random.Random(5)
    path = tmp_path / "r.jsonl"
    write_jsonl(path, [json.dumps(make_event("rating", i, rng)) for i in range(20)])
    home = tmp_path / "home"
    run = subprocess.run([sys.executable, "-m", "pipeline.cli", "ingest", "--files", str(path),
                          "--home", str(home), "--no-progress", "--json"],
                         cwd=REPO, capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    assert json.loads(run.stdout)["events"] == {"rating": 20}
    stats = subprocess.run([sys.executable, "-m", "pipeline.cli", "store", "stats", "--home",
                            str(home)], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert stats.returncode == 0 and "rating" in stats.stdout and "20" in stats.stdout


@pytest.mark.parametrize("name", ["x.txt"])
def test_unknown_format_is_a_clear_error(tmp_path, name):
    (tmp_path / name).write_text("{}\n")
    with pytest.raises(ValueError, match="cannot tell the format"):
        ingest_files([tmp_path / name], settings=Settings(home=tmp_path), progress=False)
