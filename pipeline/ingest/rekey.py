"""Re-key a topic by user: the stage between producers we do not own and the refreshers.

A refresher group splits a topic's partitions, so it splits users only where each user's
events are in one partition. ``rankstream produce`` keys every event by its user; other
producers may not (no key, a session id, round-robin). :class:`Rekeyer` reads such a topic
once, in a consumer group of its own (``rankstream.rekey.<source>``: run several for more
throughput, Kafka splits the source's partitions between them), and writes every event to a
target topic through :class:`~pipeline.ingest.producer.EventProducer`, the partitioner
``rankstream produce`` uses: a user's events then land in one partition of the target, in the
order they were read. The refreshers (and ingest) read the target.

**Nothing lost, nothing judged twice.** A message's events go out one by one, keyed by their
user; a column batch is split into its events (re-sent as batches per target partition with
``encoding="compact"``). A message that does not decode, or an event without a user id, is
passed on as it came (an event of a batch or array alone, as ingest's dead letters keep it),
without a key, so the target's reader dead-letters it with its own reason (this stage does not
decide what is valid). Offsets are committed only after the producer's
flush has every event read before them: a crash re-sends at most the batch in flight, and a
copy is the same event, which training and the refresher count once (a comparison by its
``event_id``, a rating or an interaction by its user and item).

**The target** is created, when missing, with the source's partitions and replication factor
(a broker's auto-creation would make it with its default partitions, often one: no split at
all); an existing target is used as it is.

Examples
--------
Needs a broker, so not run here::

    from pipeline.ingest.rekey import Rekeyer
    counts = Rekeyer("clicks", "clicks.by-user", settings).run(until_idle=5.0)
"""

from __future__ import annotations

import logging
import threading
import time

from pipeline.ingest.codec import (
    DecodeError,
    batch_columns,
    batch_row,
    decode,
    is_batch,
    reencode,
)
from pipeline.ingest.kafka_group import GROUP_CONFIG, never_auto_create
from pipeline.ingest.producer import EventProducer, user_key

log = logging.getLogger(__name__)

POLL_RECORDS = 5000       # messages per poll, and so per flush and commit
TARGET_SUFFIX = ".by-user"


def group_of(source: str) -> str:
    return f"rankstream.rekey.{source}"


def target_of(source: str) -> str:
    """The default target of ``source``: ``<source>.by-user``."""
    return source + TARGET_SUFFIX


class Rekeyer:
    """Read ``source`` and write its events to ``target`` keyed by user (see the module).

    Parameters
    ----------
    source, target : str
        Topics; ``target`` is created like ``source`` when missing.
    settings : pipeline.settings.Settings
        ``kafka_bootstrap`` and ``kafka_security``.
    encoding : {"compact", "json", "msgpack"}
        How events are written to ``target``: msgpack column batches per partition (the
        default: the fewest bytes and messages), or one message per event.
    stop : threading.Event, optional
        Set it to stop after the batch in hand.
    group : str, optional
        The consumer group (default ``rankstream.rekey.<source>``).
    """

    def __init__(self, source: str, target: str, settings, *, encoding: str = "compact",
                 stop: threading.Event | None = None, group: str | None = None):
        if source == target:
            raise ValueError(f"the target topic is the source {source!r}: re-keying a topic "
                             "into itself would read its own output for ever; name another")
        self.source, self.target, self.settings = source, target, settings
        self.encoding, self.group = encoding, group or group_of(source)
        self.stop = stop or threading.Event()
        self.counts = {"messages": 0, "events": 0, "passed_on": 0}

    def run(self, until_idle: float | None = None) -> dict:
        """Re-key until ``stop`` is set, or (``until_idle``) until no message came for that
        many seconds; returns the counts: messages read, events re-sent by user, messages
        passed on as they came (undecodable, or an event without a user)."""
        from kafka import KafkaConsumer
        from kafka.errors import CommitFailedError

        security = self.settings.kafka_security
        self._ensure_target()
        consumer = KafkaConsumer(
            self.source, bootstrap_servers=self.settings.kafka_bootstrap,
            group_id=self.group, enable_auto_commit=False,
            auto_offset_reset="earliest", allow_auto_create_topics=False, **GROUP_CONFIG,
            **security)
        never_auto_create(consumer)
        producer = EventProducer(self.settings.kafka_bootstrap, encoding=self.encoding,
                                 security=security)
        last_message = time.monotonic()
        try:
            while not self.stop.is_set():
                polled = consumer.poll(timeout_ms=200, max_records=POLL_RECORDS)
                records = [r for batch in polled.values() for r in batch]
                if not records:
                    if until_idle is not None and time.monotonic() - last_message >= until_idle:
                        break
                    continue
                last_message = time.monotonic()
                for record in records:
                    self._forward(producer, record.value)
                producer.flush()      # every event read so far is on the broker:
                try:                  # only now are their offsets committed
                    consumer.commit()
                except CommitFailedError as err:   # a rebalance took the partitions
                    log.warning("re-key %s: commit failed (%s); the partitions' new owner "
                                "sends the batch again (the same events, counted once)",
                                self.source, err)
                log.info("re-keyed %d messages from %s to %s (%d events in all)",
                         len(records), self.source, self.target, self.counts["events"])
        finally:
            producer.close()
            consumer.close()
        return dict(self.counts)

    def _forward(self, producer: EventProducer, value: bytes | None) -> None:
        """Send one source message's events to the target, each keyed by its user; what has
        no user id, or does not decode, goes on as it came."""
        self.counts["messages"] += 1
        try:
            obj, fmt = decode(value or b"")
            events = _events(obj)
        except DecodeError:
            producer.send_raw(self.target, value)
            self.counts["passed_on"] += 1
            return
        for event in events:
            if user_key(event) is None:     # its reader refuses it, with the reason
                producer.send_raw(self.target, reencode(event, fmt, value or b""))
                self.counts["passed_on"] += 1
            else:
                producer.send(self.target, event)
                self.counts["events"] += 1

    def _ensure_target(self) -> None:
        """Create the target with the source's partitions and replication when it is missing;
        a missing source is an error that says so."""
        from kafka.admin import KafkaAdminClient, NewTopic
        from kafka.errors import TopicAlreadyExistsError

        admin = KafkaAdminClient(bootstrap_servers=self.settings.kafka_bootstrap,
                                 **self.settings.kafka_security)
        try:
            topics = set(admin.list_topics())
            if self.source not in topics:
                raise ValueError(f"topic {self.source!r} does not exist on "
                                 f"{self.settings.kafka_bootstrap}: nothing to re-key")
            if self.target in topics:
                return
            partitions = admin.describe_topics([self.source])[0]["partitions"]
            replicas = partitions[0].get("replica_nodes") if partitions else None
            replication = len(replicas) if replicas else 1
            try:
                admin.create_topics([NewTopic(self.target, len(partitions), replication)])
            except TopicAlreadyExistsError:    # another re-keyer made it first
                pass
            log.warning("created topic %s with %d partitions (replication %d), like %s",
                        self.target, len(partitions), replication, self.source)
        finally:
            admin.close()


def _events(obj) -> list:
    """The events of a decoded message: a column batch's rows (each with the batch's kind),
    an array's items, or the one event."""
    if is_batch(obj):
        columns, n = batch_columns(obj)
        kind = obj.get("kind")
        extra = {"kind": kind} if type(kind) is str else {}
        return [{**batch_row(columns, i), **extra} for i in range(n)]
    return obj if type(obj) is list else [obj]
