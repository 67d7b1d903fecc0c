"""CSV and Parquet columns mapped onto event fields (``--columns``) with the unit of their times
(``--time-unit``, checked against the values): MovieLens's own ``ratings.csv`` (epoch seconds)
ingests with the right event times and trains ``movies``; a wrong unit or a mapping that does
not fit the file is one line, before anything is stored."""

from __future__ import annotations

import json
from datetime import datetime, timezone

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from pipeline.cli import main
from pipeline.ingest import synthetic
from pipeline.ingest.columns import Columns, check_time_unit, time_unit_of, to_ms
from pipeline.ingest.files import ingest_files
from pipeline.ingest.open_store import open_store
from pipeline.settings import Settings
from pipeline.training import retrain
from pipeline.training.config import parse_model

SECONDS = synthetic.BASE_TS // 1000          # 2026-01-01 in epoch seconds


@pytest.fixture
def settings(tmp_path):
    return Settings(home=tmp_path / "home")


def _cli(capsys, settings, *args) -> tuple[int, dict | str]:
    code = main(["ingest", "--files", *map(str, args), "--home", str(settings.home),
                 "--no-progress", "--json"])
    out, err = capsys.readouterr()
    return code, (json.loads(out) if code == 0 else err.strip())


def _movielens_csv(path, events, header="userId,movieId,rating,timestamp"):
    """MovieLens's ratings.csv layout: ids without prefixes, times in epoch seconds."""
    rows = [f"{e['user'][1:]},{e['item'][1:]},{e['rating']:g},{SECONDS + n * 60}"
            for n, e in enumerate(events)]
    path.write_text(header + "\n" + "\n".join(rows) + "\n")
    return path


def test_a_movielens_ratings_csv_ingests_with_its_times_and_trains_movies(tmp_path, settings,
                                                                           capsys):
    events = synthetic.rating_events(n_users=60, n_items=40, per_user=15, seed=3)
    path = _movielens_csv(tmp_path / "ratings.csv", events)
    code, summary = _cli(capsys, settings, path)          # no --kind, no --columns
    assert code == 0 and summary["events"] == {"rating": 900}, summary
    assert summary["dead_letters"] == {}
    table = open_store(settings).read("rating")
    assert sorted(table.column("ts").to_pylist()) == [(SECONDS + n * 60) * 1000
                                                      for n in range(900)]
    by_pair = {(r["user"], r["item"]): r for r in table.to_pylist()}
    first = by_pair[(events[0]["user"][1:], events[0]["item"][1:])]
    assert first["ts"] == SECONDS * 1000 and first["rating"] == events[0]["rating"]
    assert datetime.fromtimestamp(first["ts"] / 1000, timezone.utc).year == 2026
    code, err = _cli(capsys, settings, path, "--time-unit", "ms")       # the header, checked
    assert code == 2 and "holds epoch seconds" in err and "pass --time-unit s" in err

    spec = {"algorithm": "altsvm", "kinds": ["rating"],
            "params": {"rank": 4, "item_bias": True, "comparisons": "mixed", "random_state": 0,
                       "n_threads": 1},
            "evaluation": {"holdout": 2}, "gate": {"tolerance": 1.0, "trivial_margin": -1.0}}
    run = retrain.run("movies", {"movies": parse_model("movies", spec, "test")},
                      settings=settings, publish=False)
    assert run["decision"] == "trained", run.get("reason")
    window = run["dataset"]["window"]
    assert window["max_ts"] == (SECONDS + 899 * 60) * 1000, window


def test_columns_map_any_names_and_the_unit_is_detected(tmp_path, settings, capsys):
    path = tmp_path / "plays.csv"
    path.write_text("uid,song,stars,when,extra\n"
                    + "".join(f"u{i % 5},s{i},{1 + i % 5},{synthetic.BASE_TS + i},x\n"
                              for i in range(20)))
    code, summary = _cli(capsys, settings, path, "--kind", "rating", "--columns",
                         "user=uid,item=song,rating=stars,ts=when")
    assert code == 0 and summary["events"] == {"rating": 20}, summary
    rows = open_store(settings).read("rating").to_pylist()
    assert sorted(r["ts"] for r in rows) == [synthetic.BASE_TS + i for i in range(20)]  # ms
    assert {r["user"] for r in rows} == {f"u{i}" for i in range(5)}
    # the same file again, as the same mapping: nothing new; an edited row: only it
    assert _cli(capsys, settings, path, "--kind", "rating", "--columns",
                "user=uid,item=song,rating=stars,ts=when")[1]["events"] == {}
    path.write_text(path.read_text().replace("u3,s3,4,", "u3,s3,1,"))
    code, summary = _cli(capsys, settings, path, "--kind", "rating", "--columns",
                         "user=uid,item=song,rating=stars,ts=when")
    assert summary["events"] == {"rating": 1} and summary["already_stored"] == 19


@pytest.mark.parametrize("unit, values, says", [
    ("ms", [SECONDS, SECONDS + 5], "column 'timestamp' holds epoch seconds ("
     f"{SECONDS} is 2026-01-01 in seconds, 1970-01-21 in milliseconds), not the milliseconds "
     "that --time-unit ms says: pass --time-unit s"),
    ("s", [synthetic.BASE_TS], "holds epoch milliseconds"),
    ("us", [synthetic.BASE_TS * 1000_000], "holds epoch nanoseconds"),
    ("auto", [SECONDS, synthetic.BASE_TS], "mixes epoch seconds (1767225600), milliseconds ("
     "1767225600000): pass --time-unit s or --time-unit ms"),
    ("auto", [5, 17], "cannot tell the unit of column 'timestamp': 5 is no date"),
])
def test_a_wrong_time_unit_is_one_line_and_nothing_is_stored(tmp_path, settings, capsys, unit,
                                                             values, says):
    path = tmp_path / "ratings.csv"
    path.write_text("userId,movieId,rating,timestamp\n"
                    + "".join(f"1,{i},4,{v}\n" for i, v in enumerate(values)))
    code, err = _cli(capsys, settings, path, "--time-unit", unit, "--columns",
                     "user=userId,item=movieId,ts=timestamp", "--kind", "rating")
    assert code == 2 and len(err.splitlines()) == 1 and says in err, err
    assert open_store(settings).next_offsets() == {}


@pytest.mark.parametrize("args, says", [
    (["--columns", "user=userid,item=movieId"],
     "--columns maps user to 'userid', which the file does not have (did you mean 'userId'?)"),
    (["--columns", "usr=userId,item=movieId"], "--columns names 'usr', not a field of rating "
                                               "events (did you mean 'user'?)"),
    (["--columns", "item=movieId"], "rating events need 'user' and no column is read as it"),
    (["--columns", "user"], "'user' is not FIELD=COLUMN"),
    (["--columns", "user=userId,user=movieId"], "--columns maps user twice"),
])
def test_a_mapping_that_does_not_fit_the_file_is_one_line(tmp_path, settings, capsys, args,
                                                          says):
    path = _movielens_csv(tmp_path / "ratings.csv", synthetic.rating_events(
        n_users=3, n_items=5, per_user=2, seed=1))
    code, err = _cli(capsys, settings, path, "--kind", "rating", *args)
    assert code == 2 and len(err.splitlines()) == 1 and says in err, err
    assert open_store(settings).next_offsets() == {}


def test_a_header_that_fits_no_field_is_refused_with_nothing_stored(tmp_path, settings, capsys):
    """Issue 51: `uid,mid,stars,when` without --columns stored nothing, sent every row to dead
    letters and exited 0. Now one line names the missing columns, exit 2, nothing stored."""
    path = tmp_path / "ratings.csv"
    path.write_text("uid,mid,stars,when\n" + "".join(
        f"{u},{i},4,{synthetic.BASE_TS + i}\n" for u in range(3) for i in range(5)))
    code, err = _cli(capsys, settings, path, "--kind", "rating")
    assert code == 2 and len(err.splitlines()) == 1, err
    assert ("its header (uid, mid, stars, when) has no 'user', 'item' or 'rating' column for "
            "rating events" in err and "--columns user=COLUMN,item=COLUMN,rating=COLUMN" in err)
    assert open_store(settings).next_offsets() == {}


def test_a_quote_left_open_and_rows_without_time_are_warned_about(tmp_path, settings, capsys):
    """Issue 51: one unbalanced quote turned ~150 good rows into one dead letter and the
    summary only said "from 55 records"; a row with no timestamp got the ingest time silently.
    Both are now a WARNING line of the summary (and ``warnings`` in --json)."""
    rows = [f"u{i % 20},i{i},4,{synthetic.BASE_TS + i}" for i in range(200)]
    rows[59] = f'u1,"i59,4,{synthetic.BASE_TS + 59}'             # the quote is never closed
    quoted = tmp_path / "quoted.csv"
    quoted.write_text("user,item,rating,ts\n" + "\n".join(rows) + "\n")
    timeless = tmp_path / "timeless.csv"
    timeless.write_text("user,item,rating\n" + "".join(f"u{i},i{i},4\n" for i in range(30)))
    code, out = _cli(capsys, settings, quoted, timeless, "--kind", "rating")
    assert code == 0 and out["messages"] == 90, out
    said = "\n".join(out["warnings"])
    assert (f"{quoted}: 200 lines after the header made 60 records: the record from line 61 "
            "spans 141 lines (a quote left open?)") in said, said
    assert (f"{timeless}: 30 of 30 records have no time and got the file's modification "
            "time: add a ts column, or map one with --columns ts=COLUMN") in said, said
    fine = tmp_path / "fine.csv"
    fine.write_text("user,item,rating,ts\n" + "\n".join(rows[:59]) + "\n")
    code, out = _cli(capsys, Settings(home=tmp_path / "other"), fine, "--kind", "rating")
    assert code == 0 and out["warnings"] == [], out


def test_columns_are_for_csv_and_parquet_only(tmp_path, settings, capsys):
    path = synthetic.write_jsonl(synthetic.rating_events(n_users=2, n_items=3, per_user=2),
                                 tmp_path / "r.jsonl")
    code, err = _cli(capsys, settings, path, "--kind", "rating", "--time-unit", "s")
    assert code == 2 and "--columns and --time-unit apply to CSV and Parquet files" in err


def test_parquet_columns_in_seconds_and_timestamp_columns(tmp_path, settings):
    n = 12
    seconds = pa.table({"userId": [f"{i % 3}" for i in range(n)], "movieId": list(range(n)),
                        "rating": [float(1 + i % 5) for i in range(n)],
                        "timestamp": [SECONDS + i for i in range(n)]})
    pq.write_table(seconds, tmp_path / "seconds.parquet")
    summary = ingest_files([tmp_path / "seconds.parquet"], "rating", settings=settings,
                           columns="user=userId,item=movieId,ts=timestamp", progress=False)
    assert summary.events == {"rating": n} and not summary.dead_letters
    stamps = pa.table({"user": ["a", "b"], "item": ["x", "y"], "rating": [4.0, 2.0],
                       "ts": pa.array([datetime(2026, 3, 1, 12, 0, 0),
                                       datetime(2026, 3, 2, tzinfo=timezone.utc)],
                                      pa.timestamp("us"))})
    pq.write_table(stamps, tmp_path / "stamps.parquet")
    summary = ingest_files([tmp_path / "stamps.parquet"], "rating", settings=settings,
                           progress=False)           # a timestamp column needs no flag
    assert summary.events == {"rating": 2} and not summary.dead_letters
    times = sorted(open_store(settings).read("rating").column("ts").to_pylist())
    assert times[:n] == [(SECONDS + i) * 1000 for i in range(n)]
    assert times[n:] == [1772366400000, 1772409600000]   # 2026-03-01T12:00Z, 2026-03-02


def test_units_convert_exactly_and_are_told_apart():
    assert [to_ms(v, u) for v, u in [(SECONDS, "s"), (1.25, "s"), (1_700_000_000_123, "ms"),
                                     (1_700_000_000_123_999, "us"),
                                     (1_700_000_000_123_999_999, "ns")]] == [
        SECONDS * 1000, 1250, 1_700_000_000_123, 1_700_000_000_123, 1_700_000_000_123]
    assert to_ms("2026-01-01T00:00:00Z", "s") == "2026-01-01T00:00:00Z"  # validation parses it
    assert to_ms(float("nan"), "s") != to_ms(float("nan"), "s")          # NaN stays for it
    assert to_ms(True, "s") is True
    assert [time_unit_of([v]) for v in (SECONDS, SECONDS * 1000, SECONDS * 10**6,
                                        SECONDS * 10**9, 5)] == ["s", "ms", "us", "ns", None]
    assert check_time_unit("auto", ["2026-01-01", "x"], "f", "ts") is None   # text: as it is
    assert Columns.parse(None, None) is None
    assert Columns.parse("user=u", None).time_unit == "auto"
    with pytest.raises(ValueError, match="--time-unit 'h': expected one of s, ms, us, ns, auto"):
        Columns.parse(None, "h")
