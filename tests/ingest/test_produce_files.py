"""`rankstream produce`'s file path through a real broker: every record of a JSON lines and a
CSV file becomes a message (the CSV's rows carrying ``--kind``, so a topic of any name works),
and ingest stores each event once."""

from __future__ import annotations

import json

from pipeline.ingest.kafka import ingest_kafka, new_group_id
from pipeline.ingest.open_store import open_store
from pipeline.ingest.producer import produce_files
from tests.ingest.factory import new_topic, settings_for

T0 = 1_700_000_000_000      # epoch ms


def test_files_are_produced_and_ingested_once(kafka_bootstrap, tmp_path):
    topic = new_topic(kafka_bootstrap, partitions=1, prefix="produce-files")
    lines = tmp_path / "a.jsonl"
    lines.write_text("".join(json.dumps({"kind": "rating", "event_id": f"j{i}", "ts": T0 + i,
                                         "user": f"u{i % 7}", "item": f"i{i}", "rating": 4.0})
                             + "\n" for i in range(30)))
    table = tmp_path / "b.csv"
    table.write_text("event_id,ts,user,item,rating\n"
                     + "".join(f"c{i},{T0 + 1000 + i},u{i % 5},i{i},3.0\n" for i in range(20)))
    sent = produce_files([lines, table], topic, bootstrap=kafka_bootstrap, kind="rating",
                         progress=True)
    assert sent["events"] == 50
    settings = settings_for(tmp_path, kafka_bootstrap)
    summary = ingest_kafka([topic], settings=settings, group_id=new_group_id("produce"),
                           until_end=True, progress=False)
    letters = open_store(settings).read_dead_letters().to_pylist()
    assert summary.events.get("rating") == 50 and not summary.dead_letters, letters[:3]
    ids = open_store(settings).read("rating").column("event_id").to_pylist()
    assert sorted(ids) == sorted([f"j{i}" for i in range(30)] + [f"c{i}" for i in range(20)])
