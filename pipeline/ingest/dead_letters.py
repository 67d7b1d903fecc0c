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
  ``.offset``, ``.index`` (and ``.size``, ``.truncated`` for a payload over 256 KiB, which is
  sent truncated). These are sent and acknowledged *before* the store segment is written, so a
  crash in between may send a dead letter twice (at least once; the key identifies it), and a
  topic that refuses them stops ingestion before anything of those offsets is stored.

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
from typing import NamedTuple

import pyarrow as pa

DEAD_LETTER_MAX_BYTES = 256 << 10    # larger payloads go to the topic truncated
DEAD_LETTER_KIND = "dead_letter"     # the name dead-letter segments go by in a segment group
DEAD_LETTER_SCHEMA = pa.schema([
    ("topic", pa.string()), ("partition", pa.int32()), ("offset", pa.int64()),
    ("index", pa.int32()), ("kind", pa.string()), ("reason", pa.string()),
    ("raw", pa.binary()), ("ingested_at", pa.int64()),
])


class Malformed(NamedTuple):
    """A record a file source could not read (a CSV record with a cell over the size limit, a
    broken quote): it becomes one dead letter with this reason, not a failed file."""

    reason: str
    raw: bytes = b""


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

    def truncate(self, n: int) -> None:
        """Forget every dead letter after the first ``n``."""
        for column in (self.offsets, self.indexes, self.kinds, self.reasons, self.raws):
            del column[n:]

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


class DeadLetterTopicError(RuntimeError):
    """The dead-letter topic refused a dead letter; ingestion stops before storing or committing
    the offsets it came from."""


class DeadLetterPublisher:
    """Sends dead letters to the dead-letter topic with a kafka-python producer.

    A payload over ``max_bytes`` is sent truncated to ``max_bytes``, with the headers
    ``rankstream.size`` (the original size) and ``rankstream.truncated``; the local dead-letter
    files keep it whole. Any send the broker refuses raises :class:`DeadLetterTopicError`
    naming the topic, the broker's error and what to do about it.
    """

    def __init__(self, topic: str, producer, max_bytes: int = DEAD_LETTER_MAX_BYTES):
        self.topic = topic
        self.producer = producer
        self.max_bytes = max_bytes
        self.sent = 0

    def publish(self, table: pa.Table) -> None:
        """Send every row of a dead-letter table and wait until the broker has them all."""
        from kafka.errors import KafkaError

        futures = []
        try:
            for row in table.to_pylist():
                where = f"{row['topic']}/{row['partition']}/{row['offset']}/{row['index']}"
                raw = row["raw"]
                headers = [("rankstream.reason", row["reason"].encode()),
                           ("rankstream.topic", row["topic"].encode()),
                           ("rankstream.partition", str(row["partition"]).encode()),
                           ("rankstream.offset", str(row["offset"]).encode()),
                           ("rankstream.index", str(row["index"]).encode())]
                if len(raw) > self.max_bytes:
                    headers += [("rankstream.size", str(len(raw)).encode()),
                                ("rankstream.truncated", b"1")]
                    raw = raw[:self.max_bytes]
                futures.append(self.producer.send(self.topic, value=raw, key=where.encode(),
                                                  headers=headers))
            self.producer.flush(timeout=60)
        except KafkaError as err:
            raise self._refused(err) from None
        for future in futures:
            if not future.is_done or future.failed():
                raise self._refused(future.exception or TimeoutError("not acknowledged"))
        self.sent += table.num_rows

    def _refused(self, err) -> DeadLetterTopicError:
        return DeadLetterTopicError(
            f"the dead-letter topic {self.topic!r} refused a dead letter "
            f"({type(err).__name__}: {err}); nothing of these offsets was stored or committed, "
            "and ingestion stopped so that no message is lost. Make the topic writable: create "
            "it (or let the broker auto-create topics), grant this client write access to it, "
            f"and let it accept records of {self.max_bytes + 4096} bytes (topic config "
            "max.message.bytes), or point RANKSTREAM_DEAD_LETTER_TOPIC at a topic that is; "
            "then run ingest again")

    def close(self) -> None:
        self.producer.close()


def export_jsonl(table: pa.Table, path: str | Path) -> int:
    """Write dead letters as JSON lines, raw bytes in base64 (``raw_base64``); returns rows."""
    with open(path, "w", encoding="utf-8") as fh:
        for row in table.to_pylist():
            row["raw_base64"] = base64.b64encode(row.pop("raw")).decode("ascii")
            fh.write(json.dumps(row, ensure_ascii=False) + "\n")
    return table.num_rows
