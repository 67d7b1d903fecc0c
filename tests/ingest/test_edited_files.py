"""Files tracked by content: an edited file stores its changed and appended events and reports
the removed ones; a copy stores nothing twice; a crash between the ledger and the store loses
nothing; a store written before the ledger is not stored again."""

from __future__ import annotations

import json

import numpy as np
import pytest

from pipeline.cli import main
from pipeline.ingest.files import ingest_files
from pipeline.ingest.ledger import FILE_TOPIC, FileLedger, record_key
from pipeline.ingest.open_store import open_store
from pipeline.ingest.store import legacy_file_topic
from pipeline.settings import Settings
from pipeline.training.trainers.altsvm_data import collaborative


def _ratings(n, start=0):
    return [{"kind": "rating", "event_id": f"r{i}", "ts": 1_700_000_000_000 + i,
             "user": f"u{i % 13}", "item": f"i{i}", "rating": 1 + i % 5}
            for i in range(start, start + n)]


def _write(path, events):
    path.write_text("".join(json.dumps(e) + "\n" for e in events))


def _stored(settings):
    table = open_store(settings).read("rating")
    return table.to_pylist()


def test_an_edited_file_stores_changed_and_appended_events(tmp_path, capsys):
    settings = Settings(home=tmp_path / "home")
    path = tmp_path / "ratings.jsonl"
    events = _ratings(300)
    _write(path, events)
    args = ["ingest", "--files", str(path), "--home", str(settings.home), "--no-progress"]
    assert main(args) == 0
    assert "ingested 300 events" in capsys.readouterr().out
    edited = events[1:] + _ratings(1, start=300)         # first line deleted, one appended
    edited[4] = {**edited[4], "rating": 1 if edited[4]["rating"] != 1 else 5}   # one changed
    _write(path, edited)
    assert main(args + ["--json"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["events"] == {"rating": 2} and summary["messages"] == 300
    assert summary["already_stored"] == 298
    assert summary["removed"] == [f"{path}: 2"]          # the deleted line, the old version
    data = collaborative(open_store(settings), holdout=0)
    met = {(data.users.ids[u], data.items.ids[i]): r
           for u, i, r in zip(data.met["user"], data.met["item"], data.met["rating"])}
    changed = edited[4]
    assert met[(changed["user"], changed["item"])] == changed["rating"]   # the new one wins
    assert len(met) == 301                                # nothing counted twice
    assert main(args) == 0
    assert "ingested 0 events" in capsys.readouterr().out


def test_a_copy_under_another_path_is_not_stored_twice(tmp_path):
    settings = Settings(home=tmp_path / "home")
    path, copy = tmp_path / "a.jsonl", tmp_path / "elsewhere" / "b.jsonl"
    _write(path, _ratings(50))
    copy.parent.mkdir()
    copy.write_bytes(path.read_bytes())
    assert sum(ingest_files([path], settings=settings, progress=False).events.values()) == 50
    again = ingest_files([copy], settings=settings, progress=False)
    assert not again.events and again.already_stored == 50 and again.messages == 50
    assert len(_stored(settings)) == 50


def test_plain_csv_edited_keeps_one_rating_per_user_and_item(tmp_path):
    settings = Settings(home=tmp_path / "home")
    path = tmp_path / "plain.csv"
    rows = [f"u{i % 4},i{i},{1 + i % 5}" for i in range(20)]
    path.write_text("user,item,rating\n" + "\n".join(rows) + "\n")
    ingest_files([path], "rating", settings=settings, progress=False)
    rows[3] = "u3,i3,5"                                   # was 4
    path.write_text("user,item,rating\n" + "\n".join(rows) + "\n")
    second = ingest_files([path], "rating", settings=settings, progress=False)
    assert second.events == {"rating": 1} and second.removed == [f"{path}: 1"]
    data = collaborative(open_store(settings), holdout=0)
    assert len(data.met["user"]) == 20
    at = [j for j in range(20) if data.items.ids[data.met["item"][j]] == "i3"]
    assert data.met["rating"][at[0]] == 5


def _one_file(tmp_path, n: int):
    """(settings, file of ``n`` ratings, the events, the store)."""
    settings = Settings(home=tmp_path / "home")
    path = tmp_path / "a.jsonl"
    events = _ratings(n)
    _write(path, events)
    return settings, path, events, open_store(settings)


def test_a_crash_between_ledger_and_store_loses_nothing(tmp_path):
    settings, path, events, store = _one_file(tmp_path, 40)
    # the process died after writing the keys of a group and before the group itself
    keys = [record_key(b"jsonl||" + json.dumps(e).encode()) for e in events]
    FileLedger(store.root).add(0, 39, keys)
    summary = ingest_files([path], settings=settings, progress=False)
    assert summary.events == {"rating": 40}
    assert len(_stored(settings)) == 40


def test_a_store_from_before_the_ledger_is_not_stored_again(tmp_path):
    settings, path, events, store = _one_file(tmp_path, 30)
    first = ingest_files([path], settings=settings, progress=False)  # lay out the rows as then
    assert first.events == {"rating": 30}
    table = store.read("rating")
    for directory in sorted(store.root.glob("kind=rating/topic=*")):
        _remove_tree(directory)
    _remove_tree(store.root / ".files")
    store.write(legacy_file_topic(path), 0, first=0, last=19,
                tables={"rating": table.slice(0, 20)})       # the old layout: 20 of 30 rows
    again = ingest_files([path], settings=settings, progress=False)
    assert again.events == {"rating": 10} and again.already_stored == 20
    assert sorted(r["event_id"] for r in _stored(settings)) == sorted(e["event_id"]
                                                                     for e in events)
    assert not ingest_files([path], settings=settings, progress=False).events
    assert store.next_offset(FILE_TOPIC, 0) == 10


def _remove_tree(path):
    import shutil

    shutil.rmtree(path)


def test_record_keys_depend_on_how_the_file_is_read(tmp_path):
    settings = Settings(home=tmp_path / "home")
    path = tmp_path / "x.csv"
    path.write_text("user,item\nu1,i1\nu2,i2\n")
    assert ingest_files([path], "interaction", settings=settings, progress=False).events == {
        "interaction": 2}
    # the same rows read another way (its columns swapped) are other events
    again = ingest_files([path], "interaction", settings=settings, progress=False,
                         columns="user=item,item=user")
    assert again.events == {"interaction": 2} and not again.already_stored
    # and a kind whose fields the header lacks is refused before anything is read (issue 51)
    with pytest.raises(ValueError, match="has no 'rating' column for rating events"):
        ingest_files([path], "rating", settings=settings, progress=False)
    assert np.all(np.diff(FileLedger(open_store(settings).root)
                          .stored_keys(10**9).astype(np.float64)) > 0)
