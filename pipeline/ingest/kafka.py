"""Ingestion: Kafka topics (or files) -> validated event store; bad events -> dead letters.

:func:`ingest_kafka` is a kafka-python consumer in a consumer group with auto-commit off. It
polls bounded batches, decodes and validates them per partition, and flushes a partition's
buffer to the store as one durable segment group when it holds ``flush_events`` events or is
``flush_interval`` seconds old. Offsets are committed to Kafka *after* the segment is durable,
for lag monitoring only: on every partition assignment the consumer seeks to the store's own
next offset, which makes the store's contents exactly-once however the process stops. Before a
rebalance takes partitions away, their buffers are flushed.

A flush is written by one background thread while the consumer goes on polling and decoding
(Parquet encoding, compression and fsync release the GIL): at most one segment group per
partition is in flight, its offsets are committed by the main thread once the group is
durable, and a partition that has a group in flight waits for it before the next one. If the
store refuses a group (``OverlapError``: another consumer stored those offsets), what the
partition buffered since (and the rest of the poll's records of it) is dropped as well and the
consumer seeks back to the store's end.

A topic deleted and created again restarts its offsets at 0, below what the store holds from
it: when a partition's log ends before the store's next offset (checked at every assignment,
and when the store refuses a group), its events are stored as a new generation of the topic
(``TOPIC~g2``, ...) from its beginning, beside the old ones, and the run's summary says so.
(A re-created topic that already grew past the old end is not detected that way: it would take
Kafka's topic ids.)

Two run modes: ``until_end=True`` captures the end offsets at start, drains up to them and
returns (for Airflow tasks); otherwise it follows the topics until SIGTERM/SIGINT (or
``stop_event``), then flushes, commits and leaves the group cleanly.

This module is the entry point; one consumer's run (buffers, flushes, commits, rebalance hooks)
is :mod:`pipeline.ingest.kafka_run`, its group membership :mod:`pipeline.ingest.kafka_group`.
:mod:`pipeline.ingest.files` feeds the same validation and store from files.
"""

from __future__ import annotations

import logging
import socket
import threading
from collections.abc import Iterable, Mapping

from pipeline.ingest.buffer import DEFAULT_MAX_MESSAGE_BYTES
from pipeline.ingest.kafka_group import (
    GROUP_CONFIG,
    leave_group,
    member_slot,
    new_group_id,
    stop_on_signals,
)
from pipeline.ingest.kafka_run import KafkaRun
from pipeline.ingest.open_store import open_store
from pipeline.ingest.store import EventStore
from pipeline.ingest.summary import IngestSummary

__all__ = ["DEFAULT_GROUP", "FETCH_CONFIG", "check_kafka_reachable", "ingest_kafka",
           "member_slot", "new_group_id"]

log = logging.getLogger(__name__)

DEFAULT_GROUP = "rankstream-ingest"
FETCH_CONFIG = {"fetch_max_bytes": 64 << 20, "max_partition_fetch_bytes": 16 << 20}
_KafkaRun = KafkaRun   # the name tests/adversarial/faulty_ingest.py patches


def ingest_kafka(topics: Iterable[str] | Mapping[str, str | None], *, kind: str | None = None,
                 settings=None, store: EventStore | None = None,
                 group_id: str = DEFAULT_GROUP, until_end: bool = False,
                 flush_events: int = 200_000, flush_interval: float = 5.0,
                 max_poll_records: int = 20_000, max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES,
                 instance_id: str | None = None, timeout: float | None = None,
                 check_crcs: bool = True, progress: bool = True,
                 consumer_config: Mapping | None = None,
                 stop_event: threading.Event | None = None) -> IngestSummary:
    """Consume topics into the event store; bad events to the dead-letter topic and directory.

    Parameters
    ----------
    topics : iterable of str, or mapping topic -> default kind
        Topics to subscribe to. Events without a ``kind`` field take their topic's default
        kind (from the mapping, else ``kind``).
    kind : str, optional
        Default kind for every topic not given one by the mapping.
    settings : Settings, optional
        Bootstrap servers, security, store and dead-letter locations, dead-letter topic
        (default ``Settings.load()``).
    store : EventStore, optional
        Overrides the store of ``settings``.
    group_id : str
        Consumer group.
    until_end : bool
        Drain to the end offsets seen at start, then return; else follow until stopped.
    flush_events, flush_interval : int, float
        Flush a partition once it buffers this many events (and dead letters) or this many
        seconds after its first buffered message.
    max_poll_records : int
        Upper bound of one ``poll()`` (memory bound with ``flush_events``).
    max_message_bytes : int
        Larger messages are dead letters.
    instance_id : str, optional
        Static group membership (KIP-345): a restarted consumer with the same id gets its
        partitions back at once instead of waiting for the dead one's session to time out.
        Default: an id stable per host, user, group and process slot (:func:`member_slot`), so
        a restart after a crash resumes at once as well.
    timeout : float, optional
        Give up after this many seconds (flushing what was read).
    check_crcs : bool
        Let kafka-python check record CRCs (costly in pure Python unless the ``crc32c``
        package is installed).
    consumer_config : mapping, optional
        More ``KafkaConsumer`` keyword arguments (override the defaults above).
    stop_event : threading.Event, optional
        Set it to stop a follow-mode run (SIGTERM/SIGINT do the same in the main thread).

    Returns
    -------
    IngestSummary
    """
    settings = settings or _settings()
    if not settings.kafka_bootstrap:
        raise ValueError("no Kafka bootstrap servers configured (RANKSTREAM_KAFKA_BOOTSTRAP, "
                         "--bootstrap or kafka_bootstrap in the TOML file); "
                         "use ingest_files() for embedded mode")
    default_kinds = (dict(topics) if isinstance(topics, Mapping)
                     else dict.fromkeys(topics, None))
    default_kinds = {t: k or kind for t, k in default_kinds.items()}
    run = KafkaRun(settings, store or open_store(settings), default_kinds,
                    group_id=group_id, flush_events=flush_events, flush_interval=flush_interval,
                    max_poll_records=max_poll_records, max_message_bytes=max_message_bytes,
                    progress=progress, stop_event=stop_event or threading.Event())
    with stop_on_signals(run.stop_event), member_slot(group_id, instance_id) as member:
        log.info("consumer group %s, static member id %s", group_id, member)
        config = {"group_instance_id": member, "check_crcs": check_crcs,
                  "max_poll_records": max_poll_records, **FETCH_CONFIG, **GROUP_CONFIG,
                  **(consumer_config or {})}
        summary = run.run(config, until_end=until_end, timeout=timeout)
        if instance_id is None:  # a clean end hands the partitions over now, not in 45 s
            leave_group(settings, group_id, member)
        return summary


def check_kafka_reachable(bootstrap: str, timeout: float = 3.0) -> None:
    """One line, at once, when no bootstrap server accepts a TCP connection (kafka-python would
    otherwise log dozens of lines and time out after 30 s)."""
    tried = []
    for server in bootstrap.split(","):
        host, _, port = server.strip().rpartition(":")
        try:
            with socket.create_connection((host.strip("[]") or "localhost", int(port)),
                                          timeout=timeout):
                return
        except (OSError, ValueError) as err:
            tried.append(f"{server.strip()} ({type(err).__name__})")
    raise ValueError(f"Kafka does not answer at {', '.join(tried)}: start it "
                     "(infra/kafka/start.sh) or fix --bootstrap / RANKSTREAM_KAFKA_BOOTSTRAP")


def _settings():
    from pipeline.settings import Settings

    return Settings.load()
