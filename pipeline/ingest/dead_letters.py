"""Dead letters: every event that fails decoding or validation, kept with its reason.

A dead letter records the raw bytes, where they came from (topic, partition, offset; ``index``
is the event's position inside a batch message, -1 when the whole message is bad) and the
reason. For an event out of a batch message the raw bytes are that event re-encoded in the
message's own format (the rest of the batch was fine and is in the store).

Dead letters go to two places:

* the local dead-letter directory, as Parquet segments written **in the same atomic group** as
  the store segments of the same offsets (see :mod:`pipeline.ingest.store`), so a crash never
  loses or repeats one there; ``EventStore.read_dead_letters()`` reads them, :func:`export_jsonl`
  writes them as JSON lines with the raw bytes in base64;
* the dead-letter topic (``Settings.dead_letter_topic``), value = raw bytes, key =
  ``topic/partition/offset/index``, headers ``rankstream.reason``, ``.topic``, ``.partition``,
  ``.offset``, ``.index``. These are sent and flushed *before* the store segment is written,
  so a crash in between may send a dead letter twice (at least once; the key identifies it).

Examples
--------
>>> from pipeline.ingest.dead_letters import DeadLetters
>>> dead = DeadLetters()
>>> dead.add(offset=7, index=-1, reason="bad JSON: Expecting value at line 1 column 1",
...          raw=b"{oops")
>>> dead.table("ratings", 0).select(["offset", "reason"]).to_pylist()
[{'offset': 7, 'reason': 'bad JSON: Expecting value at line 1 column 1'}]
"""

from __future__ import annotations

import base64
import json
import time
from collections import Counter
from pathlib import Path

import pyarrow as pa

DEAD_LETTER_KIND = "dead_letter"     # the name dead-letter segments go by in a segment group
DEAD_LETTER_SCHEMA = pa.schema([
    ("topic", pa.string()), ("partition", pa.int32()), ("offset", pa.int64()),
    ("index", pa.int32()), ("kind", pa.string()), ("reason", pa.string()),
    ("raw", pa.binary()), ("ingested_at", pa.int64()),
])


class DeadLetters:
    """Dead letters of one topic partition, collected until the next store flush."""

    def __init__(self):
        self.offsets: list[int] = []
        self.indexes: list[int] = []
        self.kinds: list[str | None] = []
        self.reasons: list[str] = []
        self.raws: list[bytes] = []

    def __len__(self) -> int:
        return len(self.offsets)

    def add(self, offset: int, index: int, reason: str, raw: bytes, kind: str | None = None):
        self.offsets.append(offset)
        self.indexes.append(index)
        self.kinds.append(kind)
        self.reasons.append(reason)
        self.raws.append(bytes(raw))

    def table(self, topic: str, partition: int) -> pa.Table:
        n = len(self)
        now = int(time.time() * 1000)
        return pa.Table.from_pydict({
            "topic": [topic] * n, "partition": [partition] * n, "offset": self.offsets,
            "index": self.indexes, "kind": self.kinds, "reason": self.reasons, "raw": self.raws,
            "ingested_at": [now] * n}, schema=DEAD_LETTER_SCHEMA)

    def counts(self) -> Counter:
        """Number of dead letters per kind (``"message"`` when the kind is unknown)."""
        return Counter(kind or "message" for kind in self.kinds)


class DeadLetterPublisher:
    """Sends dead letters to the dead-letter topic with a kafka-python producer."""

    def __init__(self, topic: str, producer):
        self.topic = topic
        self.producer = producer
        self.sent = 0

    def publish(self, table: pa.Table) -> None:
        """Send every row of a dead-letter table and wait until the broker has them all."""
        for row in table.to_pylist():
            where = f"{row['topic']}/{row['partition']}/{row['offset']}/{row['index']}"
            headers = [("rankstream.reason", row["reason"].encode()),
                       ("rankstream.topic", row["topic"].encode()),
                       ("rankstream.partition", str(row["partition"]).encode()),
                       ("rankstream.offset", str(row["offset"]).encode()),
                       ("rankstream.index", str(row["index"]).encode())]
            self.producer.send(self.topic, value=row["raw"], key=where.encode(), headers=headers)
        self.producer.flush()
        self.sent += table.num_rows

    def close(self) -> None:
        self.producer.close()


def export_jsonl(table: pa.Table, path: str | Path) -> int:
    """Write dead letters as JSON lines, raw bytes in base64 (``raw_base64``); returns rows."""
    with open(path, "w", encoding="utf-8") as fh:
        for row in table.to_pylist():
            row["raw_base64"] = base64.b64encode(row.pop("raw")).decode("ascii")
            fh.write(json.dumps(row, ensure_ascii=False) + "\n")
    return table.num_rows
