"""Mistakes a careless user makes, replayed: each must neither destroy nor serve the wrong thing.

Elsewhere, beside the code they exercise: the trial run that must not touch the production
checkpoint (``test_runs.py``), the stop script that did not know its own server
(``test_stop_pid.py``), a re-created topic and a restarted broker against the real broker
(``tests/ingest/test_recreated_topic.py``, ``test_broker_restart.py``), an edited or copied
file (``tests/ingest/test_edited_files.py``), two runs with the same seed
(``tests/training/test_reproducible.py``) and the top-K of tiny factors
(``tests/solvers/test_topk.py``).
"""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest

from pipeline.cli import main
from pipeline.cli.demo import MARKER, fresh_home
from pipeline.cli.publish import check_publishable


def test_demo_refuses_a_home_with_files_it_did_not_make(tmp_path, capsys):
    home = tmp_path / "mine"
    home.mkdir()
    (home / "thesis.tex").write_text("years of work")
    assert main(["demo", "--home", str(home)]) == 2
    err = capsys.readouterr().err
    assert "deletes nothing it did not make" in err and len(err.strip().splitlines()) == 1
    assert (home / "thesis.tex").read_text() == "years of work"
    a_file = tmp_path / "notes.txt"
    a_file.write_text("x")
    assert main(["demo", "--home", str(a_file)]) == 2
    assert a_file.read_text() == "x"


def test_demo_wipes_only_what_it_made(tmp_path):
    home = tmp_path / "demo"
    fresh_home(home)                      # new: made and marked
    assert (home / MARKER).is_file()
    (home / "runs").mkdir()
    fresh_home(home)                      # marked: wiped
    assert sorted(p.name for p in home.iterdir()) == [MARKER]
    earlier = tmp_path / "earlier"        # what a demo before the marker left
    for name in ("store", "runs", "events"):
        (earlier / name).mkdir(parents=True)
    (earlier / "report.json").write_text("{}")
    fresh_home(earlier)
    assert sorted(p.name for p in earlier.iterdir()) == [MARKER]
    (earlier / MARKER).unlink()
    (earlier / "report.json").write_text("{}")   # a report alone is not an earlier demo
    with pytest.raises(ValueError, match="did not make"):
        fresh_home(earlier)


def _run_dir(tmp_path, model="movies", gate=None):
    run = tmp_path / "run"
    run.mkdir()
    (run / "train.json").write_text(json.dumps({"model": model}))
    if gate is not None:
        (run / "gate.json").write_text(json.dumps(gate))
    return run


def test_publish_refuses_a_run_of_another_model(tmp_path):
    run = _run_dir(tmp_path, "movies")
    with pytest.raises(ValueError, match="is a run of model 'movies', not 'search'"):
        check_publishable("search", run, None, [], force=False)
    assert check_publishable("movies", run, None, [], force=False) is None


def test_publish_refuses_an_artifact_of_another_kind_or_algorithm(tmp_path):
    served = [SimpleNamespace(current=True, kind="query_docs", algorithm="kernel_ranksvm")]
    movies = SimpleNamespace(kind="user_item", algorithm="altsvm")
    with pytest.raises(ValueError, match="serves a query_docs model of 'kernel_ranksvm'"):
        check_publishable("search", tmp_path, movies, served, force=False)
    ranker = SimpleNamespace(kind="query_docs", algorithm="kernel_ranksvm:challenger-linear")
    assert check_publishable("search", tmp_path, ranker, served, force=False) is None


def test_publishing_a_rejected_run_needs_force_and_says_what_it_overrides(tmp_path):
    run = _run_dir(tmp_path, gate={"publish": False, "reason": "worse than served v3"})
    with pytest.raises(ValueError, match="gate rejected this run .*worse than served v3.*--force"):
        check_publishable("movies", run, None, [], force=False)
    said = check_publishable("movies", run, None, [], force=True)
    assert "overriding the quality gate's rejection: worse than served v3" in said


def test_one_huge_label_sizes_nothing_and_stops_no_retrain(tmp_path):
    """An ordinal label of 1e9 among normal reviews: the solver's error path allocates
    nothing, and the dataset leaves the event out (counted) so the model still trains."""
    import time

    import numpy as np

    from pipeline.ingest import synthetic
    from pipeline.ingest.files import ingest_files
    from pipeline.settings import Settings
    from pipeline.training import retrain
    from pipeline.training.config import parse_model
    from solvers import NPSVOR

    started = time.perf_counter()
    with pytest.raises(ValueError, match=r"999,999,997 ranks are missing: 3, 4, 5, .*\.\.\."):
        NPSVOR().fit(np.eye(3), np.array([1, 2, 1_000_000_000]))
    assert time.perf_counter() - started < 5

    settings = Settings(home=tmp_path / "home")
    events = synthetic.ordinal_events(n_items=60, n_reviews=300, seed=3)
    events[17]["label"] = 1_000_000_000       # outside the kind's range: a dead letter
    events[18]["label"] = 50                  # inside it, outside the model's levels
    summary = ingest_files([synthetic.write_jsonl(events, tmp_path / "reviews.jsonl")],
                           "ordinal", settings=settings, progress=False)
    assert sum(summary.dead_letters.values()) == 1
    cfg = parse_model("reviews", {"algorithm": "npsvor", "kinds": ["ordinal"],
                                  "params": {"tol": 0.01, "random_state": 0,
                                             "text_features": 2**12}}, "test")
    run = retrain.run("reviews", {"reviews": cfg}, settings=settings, publish=False)
    stats = run["dataset"]["stats"]
    assert run["decision"] == "trained" and stats["labels_out_of_range"] == 1
    assert "label outside 1..10" in stats["warning"]


def test_values_no_scale_has_are_dead_letters_and_a_declared_scale_drops_the_rest(tmp_path):
    """Ratings 1e308, 1e24 and ts = 0 are dead letters at ingest (each kind's declared range);
    -3 on a 1-5 scale is a valid rating for the kind, left out (counted) by a model that
    declares ``rating_range = [1, 5]``, and does not move its "auto" relevance threshold."""
    from pipeline.ingest import synthetic
    from pipeline.ingest.files import ingest_files
    from pipeline.ingest.open_store import open_store
    from pipeline.settings import Settings
    from pipeline.training.trainers.altsvm_data import collaborative

    settings = Settings(home=tmp_path / "home")
    events = synthetic.rating_events(n_users=40, n_items=30, per_user=8, seed=1)
    odd = [{**events[0], "event_id": "huge", "rating": 1e308},
           {**events[1], "event_id": "huger", "rating": 10**24},
           {**events[2], "event_id": "epoch", "ts": 0},
           {**events[3], "event_id": "seconds", "ts": 1_700_000_000},
           {**events[4], "event_id": "negative", "user": "u-neg", "rating": -3}]
    summary = ingest_files([synthetic.write_jsonl(events + odd, tmp_path / "r.jsonl")],
                           "rating", settings=settings, progress=False)
    reasons = open_store(settings).read_dead_letters().column("reason")
    assert summary.events == {"rating": len(events) + 1} and len(reasons) == 4
    assert sum("beyond ±1e+15" in r for r in reasons.to_pylist()) == 2
    assert sum("before 1990-01-01" in r for r in reasons.to_pylist()) == 2
    store = open_store(settings)
    declared = collaborative(store, rating_range=[1, 5], holdout=0)
    assert declared.stats["ratings_out_of_range"] == 1 and declared.stats["relevance"] == 4.0
    assert "outside 1..5 (params.rating_range)" in declared.stats["warning"]
    assert collaborative(store, holdout=0).stats["relevance"] == 3.0   # -3 stretched it
    from pipeline.training.config import parse_model

    with pytest.raises(ValueError, match=r"params.rating_range is \[5, 1\], expected"):
        parse_model("m", {"algorithm": "altsvm", "params": {"rating_range": [5, 1]}}, "x.toml")


def test_a_forgotten_kind_is_refused_up_front_and_consumes_nothing(tmp_path, capsys):
    from pipeline.ingest.files import ingest_files
    from pipeline.ingest.open_store import open_store
    from pipeline.settings import Settings

    settings = Settings(home=tmp_path / "home")
    plain = tmp_path / "ratings.csv"
    plain.write_text("user,item,rating\n" + "".join(f"u{i % 7},i{i},{1 + i % 5}\n"
                                                    for i in range(30)))
    args = ["ingest", "--files", str(plain), "--home", str(settings.home)]
    assert main(args) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "no 'kind' field and no --kind" in err
    assert "--kind KIND (one of " in err and "rating" in err
    assert main(args + ["--kind", "ratings"]) == 2
    assert "unknown kind 'ratings': give --kind one of" in capsys.readouterr().err
    # nothing was consumed: with the kind, every row is stored, with derived stable ids
    summary = ingest_files([plain], "rating", settings=settings, progress=False)
    assert summary.events["rating"] == 30 and not summary.dead_letters
    table = open_store(settings).read("rating")
    ids = table.column("event_id").to_pylist()
    assert len(set(ids)) == 30 and all(i.startswith("d-") for i in ids)
    copy = tmp_path / "copy.csv"
    copy.write_text(plain.read_text())
    ingest_files([copy], "rating", settings=settings, progress=False)
    again = open_store(settings).read("rating").column("event_id").to_pylist()
    assert set(again) == set(ids)      # the same rows have the same ids in any file
    with pytest.raises(ValueError, match="no such file"):
        ingest_files([tmp_path / "missing.csv"], "rating", settings=settings, progress=False)


@pytest.mark.parametrize("text, says", [
    ('[models.movies]\nalgorithm = "altsvm"\nparams = { rank = "fifty" }\n',
     "model 'movies' params: rank is 'fifty', expected an integer"),
    ('[models.movies\nalgorithm = "altsvm"\n', "not valid TOML: Expected ']'"),
    ('[models.movies]\nalgorithm = "altsvm"\nschedule = "every hour"\n',
     "schedule is 'every hour', expected an Airflow preset"),
])
def test_a_config_mistake_is_one_line_naming_the_file(tmp_path, capsys, text, says):
    config = tmp_path / "models.toml"
    config.write_text(text)
    assert main(["train", "movies", "--config", str(config), "--no-publish",
                 "--home", str(tmp_path / "home")]) != 0
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and str(config) in err and says in err, err


def test_recommend_without_a_user_gives_the_list_for_everyone(redis_url, capsys):
    import numpy as np

    from pipeline.serving.artifact import ModelArtifact
    from pipeline.serving.lookup import TopK
    from pipeline.serving.publish import publish
    from pipeline.serving.redis_client import as_client

    art = ModelArtifact.user_item(user_ids=["ann", "bob"], item_ids=[10, 11, 12],
                                  user_factors=np.ones((2, 4)), item_factors=np.eye(3, 4),
                                  seen=([0, 1, 1], [2]), algorithm="altsvm")
    publish("movies", art, as_client(redis_url), top_k=3, namespace="careless")
    with TopK(redis_url, namespace="careless") as topk:
        rec = topk.recommend("movies", None, k=2)
        assert rec.user is None and rec.source == "fallback" and len(rec.items) == 2
        many = topk.recommend_many("movies", [None, "ann"], k=2)
        assert [r.source for r in many] == ["fallback", "precomputed"]
    base = ["recommend", "movies", "--redis-url", redis_url, "--namespace", "careless"]
    assert main(base) == 0 and "global list: fallback" in capsys.readouterr().out
    assert main(base[:2] + [""] + base[2:]) == 1
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "is not a non-empty str" in err


def test_a_closed_pipe_is_no_traceback(tmp_path):
    import subprocess
    import sys

    from pipeline.ingest import synthetic
    from pipeline.ingest.files import ingest_files
    from pipeline.settings import Settings

    settings = Settings(home=tmp_path / "home")
    for kind, events in (("rating", synthetic.rating_events(n_users=20, n_items=10,
                                                            per_user=5, seed=1)),
                         ("ordinal", synthetic.ordinal_events(n_items=10, n_reviews=30,
                                                              seed=1))):
        ingest_files([synthetic.write_jsonl(events, tmp_path / f"{kind}.jsonl")], kind,
                     settings=settings, progress=False)
    cmd = (f"{sys.executable} -m pipeline.cli store stats --home {settings.home} "
           "| true")   # the reader is gone before the first write
    out = subprocess.run(cmd, shell=True, capture_output=True, text=True, timeout=120)
    assert "Traceback" not in out.stderr and "BrokenPipe" not in out.stderr, out.stderr


@pytest.mark.parametrize("env, says", [
    ({"RANKSTREAM_REDIS_ON_ERROR": "ignore"},
     "RANKSTREAM_REDIS_ON_ERROR is 'ignore', expected one of raise, last_known"),
    ({"RANKSTREAM_REDIS_TIMEOUT": "fast"}, "RANKSTREAM_REDIS_TIMEOUT is 'fast'"),
    ({"RANKSTREAM_STORE": "gs://bucket/x"},
     "RANKSTREAM_STORE is 'gs://bucket/x': expected a local directory or s3://bucket/prefix"),
    ({"RANKSTREAM_STORE": "s3:///x"}, "RANKSTREAM_STORE: 's3:///x' names no bucket"),
])
def test_a_settings_mistake_names_where_it_came_from(tmp_path, env, says):
    from pipeline.settings import Settings

    with pytest.raises(ValueError, match=says):
        Settings.load(environ=env)
    config = tmp_path / "c.toml"
    config.write_text('[rankstream]\nredis_timeout = "fast"\n')
    with pytest.raises(ValueError, match=r"c.toml \[rankstream\] redis_timeout is 'fast'"):
        Settings.load(environ={"RANKSTREAM_CONFIG": str(config)})


def test_train_checks_redis_before_training(tmp_path, capsys):
    import time
    from pathlib import Path

    config = Path(__file__).resolve().parents[2] / "dags" / "models.toml"
    started = time.perf_counter()
    assert main(["train", "movies", "--home", str(tmp_path / "home"), "--config", str(config),
                 "--redis-url", "redis://127.0.0.1:1/0"]) == 1
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "does not answer" in err and "--no-publish" in err
    assert time.perf_counter() - started < 30
    assert not (tmp_path / "home" / "runs").exists()     # nothing was built or trained


def test_the_default_home_does_not_depend_on_the_working_directory(tmp_path, monkeypatch):
    from pipeline.settings import Settings

    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "data"))
    homes = set()
    for where in ("a", "b"):
        (tmp_path / where).mkdir()
        monkeypatch.chdir(tmp_path / where)
        home = Settings.load(environ={}).home
        assert home.is_absolute() and not (tmp_path / where / ".rankstream").exists()
        homes.add(home)
    assert homes == {tmp_path / "data" / "rankstream"}


@pytest.mark.parametrize("command", ["ingest", "produce"])
def test_kafka_down_is_one_line_at_once(tmp_path, capsys, command):
    import time

    events = tmp_path / "e.jsonl"
    events.write_text('{"kind": "rating", "event_id": "e1", "ts": 1700000000001, "user": 1, '
                      '"item": 2, "rating": 4}\n')
    args = [command, "--bootstrap", "127.0.0.1:1", "--home", str(tmp_path / "home")]
    args += [str(events), "--kind", "rating"] if command == "produce" else ["--until-end"]
    started = time.perf_counter()
    assert main(args) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "Kafka does not answer at 127.0.0.1:1" in err, err
    assert time.perf_counter() - started < 10


def test_the_store_location_moves_store_runs_and_checkpoints_together(tmp_path):
    from pipeline.settings import Settings

    local = Settings.load({"home": tmp_path / "h", "store": str(tmp_path / "shared")},
                          environ={})
    assert not local.remote and local.root == tmp_path / "shared"
    assert {local.store_dir, local.runs_dir, local.checkpoint_dir, local.dead_letter_dir} == {
        tmp_path / "shared" / name for name in ("store", "runs", "checkpoints", "dead-letter")}
    remote = Settings.load({"home": tmp_path / "h"}, environ={"RANKSTREAM_STORE": "s3://b/p"})
    assert remote.remote and remote.runs_dir == tmp_path / "h" / "runs"    # working copies
    assert Settings.load({"home": tmp_path / "h"}, environ={}).store_dir == tmp_path / "h" / \
        "store"


def test_store_copy_copies_each_flush_once_and_says_so(tmp_path, capsys):
    from pipeline.ingest import synthetic
    from pipeline.ingest.files import ingest_files
    from pipeline.ingest.local_store import LocalEventStore
    from pipeline.settings import Settings

    settings = Settings(home=tmp_path / "a")
    events = synthetic.rating_events(n_users=20, n_items=10, per_user=5, seed=1)
    ingest_files([synthetic.write_jsonl(events, tmp_path / "r.jsonl")], "rating",
                 settings=settings, progress=False)
    target = tmp_path / "b"
    for copied in ("copied 1 flushes", "copied 0 flushes"):
        assert main(["store", "copy", "--home", str(settings.home), "--to", str(target)]) == 0
        assert copied in capsys.readouterr().out
    assert LocalEventStore(target / "store").read("rating").num_rows == len(events)
    assert main(["store", "copy", "--home", str(settings.home)]) == 1
    assert capsys.readouterr().err.strip() == ("rankstream store: store copy needs --to "
                                               "LOCATION (a directory or s3://bucket/prefix)")
