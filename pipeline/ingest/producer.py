"""Send events to Kafka: one JSON message per event (default) or compact msgpack column batches.

Used by ``rankstream produce``, the tests and the benchmark.

**Keyed by user.** An event with a ``user`` goes to the partition of its user: a JSON or msgpack
message carries the user as its key (Kafka's default partitioner: murmur2 of the key, modulo
the partitions), and a compact batch holds one partition's users, sent to that partition by
the same hash. So each user's events are in one partition, in order, whatever the encoding,
and refreshers in one consumer group split users, not events (``docs/deploy.md``).

Examples
--------
Needs a broker, so not run here::

    from pipeline.ingest.producer import EventProducer
    with EventProducer("127.0.0.1:9092", encoding="compact") as producer:
        producer.send("ratings", {"kind": "rating", "event_id": "e1", "ts": 1,
                                  "user": 7, "item": 3, "rating": 4.5})
    # leaving the block flushes: the batch is one message
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping
from pathlib import Path

from pipeline.ingest.codec import encode_batches, encode_json, encode_msgpack

ENCODINGS = ("json", "msgpack", "compact")
PRODUCER_CONFIG = {"linger_ms": 20, "batch_size": 1 << 20, "max_request_size": 4 << 20}


class EventProducer:
    """A kafka-python producer for events.

    Parameters
    ----------
    bootstrap : str
        ``host:port[,host:port]``.
    encoding : {"json", "msgpack", "compact"}
        ``json``: one UTF-8 JSON message per event; ``msgpack``: one msgpack message per event;
        ``compact``: events of one kind and topic buffered and sent as msgpack column batches
        of ``batch_events`` events (see :mod:`pipeline.ingest.codec`).
    batch_events, max_message_bytes : int
        Compact batches hold at most this many events and bytes.
    security : mapping, optional
        kafka-python security settings (``Settings.kafka_security``).
    **config
        More ``KafkaProducer`` keyword arguments.
    """

    def __init__(self, bootstrap: str, *, encoding: str = "json", batch_events: int = 1000,
                 max_message_bytes: int = 1 << 20, security: Mapping | None = None, **config):
        from kafka import KafkaProducer

        if encoding not in ENCODINGS:
            raise ValueError(f"unknown encoding {encoding!r}; expected one of {ENCODINGS}")
        self.encoding = encoding
        self.batch_events, self.max_message_bytes = batch_events, max_message_bytes
        self.producer = KafkaProducer(bootstrap_servers=bootstrap,
                                      **{**PRODUCER_CONFIG, **(security or {}), **config})
        self.pending: dict[tuple[str, str, int | None], list[dict]] = {}
        self.partitions: dict[str, int] = {}    # topic -> its partition count
        self.events = self.messages = 0

    def send(self, topic: str, event: dict, kind: str | None = None,
             partition: int | None = None) -> None:
        """Send one event (``kind``: its kind if the event has no ``kind`` field; used to group
        compact batches)."""
        self.events += 1
        batch_kind = event.get("kind", kind) if type(event) is dict else None
        user = user_key(event)
        if self.encoding == "compact" and type(batch_kind) is str:
            if partition is None and user is not None:
                partition = self.partition_of(topic, user)
            key = (topic, batch_kind, partition)
            chunk = self.pending.setdefault(key, [])
            chunk.append(event)
            if len(chunk) >= self.batch_events:
                self._send_batch(key)
            return
        value = encode_json(event) if self.encoding == "json" else encode_msgpack(event)
        # (compact: an event without a usable kind goes alone, to be rejected alone)
        self.send_raw(topic, value, partition, key=user)

    def send_many(self, topic: str, events: Iterable[dict], kind: str | None = None,
                  partition: int | None = None) -> None:
        for event in events:
            self.send(topic, event, kind, partition)

    def send_raw(self, topic: str, value: bytes, partition: int | None = None,
                 key: bytes | None = None) -> None:
        """Send bytes as they are (tests use it for malformed messages), with ``key``: the
        partition is its hash's unless ``partition`` is given."""
        self.producer.send(topic, value=value, partition=partition, key=key)
        self.messages += 1

    def partition_of(self, topic: str, key: bytes) -> int:
        """The partition Kafka's default partitioner gives ``key`` in ``topic`` (the Java
        client's too): murmur2 of the key, its sign bit cleared, modulo the partitions."""
        from kafka.partitioner.default import murmur2

        if topic not in self.partitions:
            self.partitions[topic] = len(self.producer.partitions_for(topic))
        return (murmur2(key) & 0x7FFFFFFF) % self.partitions[topic]

    def _send_batch(self, key) -> None:
        topic, kind, partition = key
        events = self.pending.pop(key, [])
        for value in encode_batches(kind, events, self.batch_events, self.max_message_bytes):
            self.send_raw(topic, value, partition)

    def flush(self) -> None:
        """Send what is buffered and wait until the broker has everything."""
        for key in list(self.pending):
            self._send_batch(key)
        self.producer.flush()

    def close(self) -> None:
        self.flush()
        self.producer.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def user_key(event) -> bytes | None:
    """The message key of an event: its ``user`` as UTF-8 text, as ingest reads ids (7 and
    "7" alike), or None where it has no id there (ingest then refuses the event anyway).

    >>> user_key({"user": 7}), user_key({"user": "u1"}), user_key({"user": 7.0})
    (b'7', b'u1', None)
    """
    user = event.get("user") if type(event) is dict else None
    if type(user) is not int and type(user) is not str:
        return None
    return str(user).encode("utf-8", "replace")


def produce_files(paths: Iterable[str | Path], topic: str, *, bootstrap: str,
                  kind: str | None = None, fmt: str | None = None, encoding: str = "json",
                  security: Mapping | None = None, progress: bool = True) -> dict:
    """Send the events of files (JSON lines, CSV, Parquet, MovieLens) to a topic.

    JSON lines are sent line by line as they are with ``encoding="json"`` (so malformed lines
    reach the consumer's dead letters too); otherwise records are decoded and re-encoded.
    Returns ``{"events": n, "messages": m, "seconds": s}``.
    """
    from pipeline.ingest.codec import DecodeError, decode
    from pipeline.ingest.sources import read_chunks
    from pipeline.ingest.summary import progress_bar

    started = time.monotonic()
    with EventProducer(bootstrap, encoding=encoding, security=security) as producer, \
            progress_bar(progress, unit="ev") as bar:
        for path in paths:
            for chunk in read_chunks(path, fmt, kind):
                if chunk.lines is not None and encoding == "json":
                    for line in chunk.lines:      # as it is, keyed by its user when it has one
                        try:
                            key = user_key(decode(line)[0])
                        except DecodeError:
                            key = None
                        producer.send_raw(topic, line, key=key)
                    producer.events += len(chunk.lines)
                elif chunk.lines is not None:
                    for line in chunk.lines:
                        try:
                            event, _ = decode(line)
                        except DecodeError:
                            producer.send_raw(topic, line)
                            continue
                        producer.send(topic, event, kind)
                else:       # a file's rows carry --kind, so any topic's consumer knows it
                    producer.send_many(topic, ([{**r, "kind": kind} if kind and "kind" not in r
                                                else r for r in chunk.rows]), kind)
                bar.update(len(chunk.numbers))
    return {"events": producer.events, "messages": producer.messages,
            "seconds": time.monotonic() - started}
