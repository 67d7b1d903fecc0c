"""`rankstream train` and `rankstream models` against a real redis-server."""

from __future__ import annotations

import json
from pathlib import Path

from pipeline.cli import main
from pipeline.ingest import synthetic
from pipeline.ingest.files import ingest_files
from pipeline.settings import Settings

CONFIG = """
[models.movies]
algorithm = "altsvm"
kinds = ["rating"]
params = { rank = 6, item_bias = true, comparisons = "mixed", random_state = 0, n_threads = 1 }
evaluation = { holdout = 4 }
"""


def _setup(tmp_path, redis_url, config_text: str, namespace: str):
    """Planted rating events ingested into a fresh HOME, a config file: ``(events, home,
    the common flags of train/models/recommend)``."""
    config = tmp_path / "models.toml"
    config.write_text(config_text)
    home = tmp_path / "home"
    events = synthetic.rating_events(n_users=150, n_items=80, per_user=25, seed=7)
    ingest_files([synthetic.write_jsonl(events, tmp_path / "r.jsonl")], "rating",
                 settings=Settings(home=home), progress=False)
    return events, home, ["--config", str(config), "--home", str(home), "--redis-url",
                          redis_url, "--namespace", namespace]


def test_train_then_models(tmp_path, redis_url, redis_client, capsys):
    _, home, common = _setup(tmp_path, redis_url, CONFIG, "clitest")
    assert main(["train", "movies", *common]) == 0
    out = capsys.readouterr().out
    assert "model movies (altsvm): published" in out and "version 1" in out
    assert main(["models", *common]) == 0
    listing = capsys.readouterr().out.splitlines()
    assert listing[1].split()[:3] == ["movies", "altsvm", "v1"]
    assert main(["models", "--json", *common]) == 0           # issue 51: for scripts
    (record,) = json.loads(capsys.readouterr().out)
    assert record["model"] == "movies" and record["served_version"] == 1
    assert record["served_as"] == "model" and isinstance(record["value"], float)
    assert record["last_checkpoint"] and record["metric"] == "topk_ndcg@10"
    assert record["heals"] == 0 and listing[1].split()[-1] == "-"
    # a refresher that healed the model (Redis lost it) says so there
    from pipeline.refresh.stats import RefreshStats

    healed = RefreshStats("movies")
    healed.heals, healed.last_heal = 2, "2026-12-06T10:00:00+00:00"
    healed.write(home)
    assert main(["models", *common]) == 0
    assert capsys.readouterr().out.splitlines()[1].endswith(
        "2x, last 2026-12-06T10:00:00+00:00")
    assert main(["train", "movies", *common]) == 0
    assert "unchanged" in capsys.readouterr().out


def test_train_without_a_config_says_how_to_give_one(tmp_path, redis_url, capsys, monkeypatch):
    monkeypatch.delenv("RANKSTREAM_CONFIG", raising=False)
    assert main(["train", "movies", "--home", str(tmp_path), "--redis-url", redis_url]) == 1
    assert "pass --config" in capsys.readouterr().err


CONFIG_TUNED = CONFIG.replace('evaluation = { holdout = 4 }', '''evaluation = { holdout = 4 }
gate = { challenger = "als" }
tune = { budget_seconds = 30, max_settings = 3, challenger_settings = 3 }''').replace(
    "rank = 6, ", "")


def _train(tmp_path, redis_url, *flags):
    _, _, common = _setup(tmp_path, redis_url, CONFIG_TUNED, f"p{tmp_path.name[-10:]}")
    return main(["train", "movies", *common, *flags])


def test_train_shows_its_phases_on_a_terminal_and_its_wall_time(tmp_path, redis_url, capsys,
                                                                monkeypatch):
    """Issue 51: `train` was silent for its whole run and its summary had no total. On a
    terminal one status line names each phase (the searches' settings k/n) and is cleared
    before the summary, which ends with the wall time."""
    monkeypatch.setattr("sys.stderr.isatty", lambda: True)
    assert _train(tmp_path, redis_url) == 0
    captured = capsys.readouterr()
    shown = [s.split("  [")[0] for s in captured.err.split("\r") if s.startswith("train movies")]
    for name in ("dataset", "tuning altsvm", "fit", "challenger als", "blends", "gate",
                 "publish", "report"):
        assert any(s.startswith(f"train movies: {name}") for s in shown), (name, shown)
    assert "train movies: tuning altsvm 1/" in "\n".join(shown)
    assert captured.err.endswith("\r\x1b[K")             # cleared for the summary
    assert captured.out.splitlines()[-1].startswith("  total    ")
    assert captured.out.splitlines()[-1].endswith(" s wall time")


def test_train_no_progress_draws_nothing(tmp_path, redis_url, capsys, monkeypatch):
    monkeypatch.setattr("sys.stderr.isatty", lambda: True)
    assert _train(tmp_path, redis_url, "--no-progress") == 0
    assert "train movies:" not in capsys.readouterr().err


def test_refresh_and_train_take_the_kafka_bootstrap_as_ingest_does(monkeypatch):
    """Issue 51: `refresh` and `train --ingest` read Kafka but had no --bootstrap."""
    import argparse

    from pipeline.cli import refresh, train
    from pipeline.cli._redis import settings_of

    monkeypatch.setenv("RANKSTREAM_KAFKA_BOOTSTRAP", "127.0.0.1:1")
    for command, args in ((refresh, []), (train, ["movies", "--ingest"])):
        parser = argparse.ArgumentParser()
        command.add_arguments(parser)
        given = parser.parse_args([*args, "--bootstrap", "127.0.0.1:9092"])
        assert settings_of(given).kafka_bootstrap == "127.0.0.1:9092"
        assert settings_of(parser.parse_args(args)).kafka_bootstrap == "127.0.0.1:1"


def test_a_degenerate_fit_is_said_once_in_the_summary_and_in_the_report(tmp_path, redis_url,
                                                                        capsys):
    """Issue 51: a degenerate TopPush fit printed its reason twice (once a raw Python warning)
    and the report did not have it. Now: one WARNING line in the summary, none raw, and the
    report carries it."""
    import random

    config = tmp_path / "models.toml"
    config.write_text('[models.ads]\nalgorithm = "toppush"\nkinds = ["outcome"]\n'
                      'params = { reg = 1.0 }\nevaluation = { metric = "average_precision" }\n')
    rng = random.Random(0)      # labels that no feature sets apart: w = 0 is the optimum
    events = [{"event_id": f"o{i}", "ts": synthetic.BASE_TS + i, "item": f"a{i}",
               "label": int(rng.random() < 0.1),
               "features": {str(j): round(rng.random(), 3) for j in range(4)}}
              for i in range(600)]
    home = tmp_path / "home"
    ingest_files([synthetic.write_jsonl(events, tmp_path / "o.jsonl")], "outcome",
                 settings=Settings(home=home), progress=False)
    main(["train", "ads", "--config", str(config), "--home", str(home), "--redis-url",
          redis_url, "--namespace", f"d{tmp_path.name[-10:]}", "--no-progress"])
    out, err = capsys.readouterr()
    said = [line for line in out.splitlines() if "DegenerateFitWarning" in line]
    assert len(said) == 1 and said[0].startswith("  WARNING  "), out
    assert "DegenerateFitWarning" not in err, err
    (report,) = (home / "runs" / "ads").glob("*/report.html")
    assert report.read_text().count("TopPush fit is degenerate") == 1


def test_two_users_are_too_little_data_said_so(tmp_path, capsys):
    """Issue 51: `train` on two users said "reg is 0.0" (then "comparisons is empty")."""
    rows = tmp_path / "r.csv"
    rows.write_text("user,item,rating,ts\nu1,i1,5,1700000000000\nu1,i2,3,1700000000001\n"
                    "u2,i1,4,1700000000002\nu2,i3,1,1700000000003\n")
    home = tmp_path / "home"
    ingest_files([rows], "rating", settings=Settings(home=home), progress=False)
    shipped = Path(__file__).resolve().parents[2] / "dags" / "models.toml"
    assert main(["train", "movies", "--config", str(shipped), "--home", str(home),
                 "--no-publish", "--no-progress"]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1] == ("rankstream train: too little data to train altsvm: 2 users and 4 met "
                       "rows give no training comparison (a user needs a liked item and "
                       "another item outside the holdout): ingest more events"), err


def test_recommend_answers_similar_fold_in_exclude_and_explain(tmp_path, redis_url, capsys):
    """Issue 51: the CLI had no similar, explain, fold-in or exclude: each is the same lookup
    as the Python client's, and an unknown item is one line."""
    from pipeline.serving.lookup import TopK

    events, _, common = _setup(tmp_path, redis_url, CONFIG, f"r{tmp_path.name[-10:]}")
    assert main(["train", "movies", *common]) == 0
    capsys.readouterr()

    def ask(*flags):
        assert main(["recommend", "movies", *flags, "-k", "3", "--json", *common]) == 0
        return json.loads(capsys.readouterr().out)

    user, item = events[0]["user"], events[0]["item"]
    mine = [e["item"] for e in events if e["user"] == user][:5]
    with TopK(redis_url, namespace=f"r{tmp_path.name[-10:]}") as topk:
        listed = topk.recommend("movies", user, k=3)
        first = listed.items[0][0]
        assert ask(user, "--exclude", first)["items"] == [
            list(x) for x in topk.recommend("movies", user, k=3, exclude=[first]).items]
        assert ask("--similar", item)["items"] == [
            list(x) for x in topk.similar("movies", item, k=3).items]
        assert ask("--items", ",".join(mine))["items"] == [
            list(x) for x in topk.fold_in("movies", mine, k=3).items]
        why = ask(user, "--explain", first)
        assert why["score"] == topk.explain("movies", user, first, k=3).score
    assert main(["recommend", "movies", user, "--explain", first, *common]) == 0
    text = capsys.readouterr().out
    assert text.startswith(f"movies version 1, user {user!r}, item {first!r}: score ")
    assert "residual" in text
    assert main(["recommend", "movies", "--similar", "no-such-item", *common]) == 1
    err = capsys.readouterr().err.strip()
    assert "'no-such-item' is not in model 'movies'" in err and len(err.splitlines()) == 1
