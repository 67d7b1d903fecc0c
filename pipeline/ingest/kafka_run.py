"""One consumer's run over its assigned partitions: a buffer per partition, flushes handed to
one writer thread, commits after each durable flush, and the rebalance hooks that keep both
right (see :mod:`pipeline.ingest.kafka` for the guarantees this keeps).
"""

from __future__ import annotations

import logging
import os
import threading
import time
from concurrent.futures import ThreadPoolExecutor

from pipeline.ingest.buffer import PartitionBuffer
from pipeline.ingest.dead_letters import DEAD_LETTER_MAX_BYTES
from pipeline.ingest.store import EventStore, OverlapError
from pipeline.ingest.summary import IngestSummary, progress_bar
from pipeline.ingest.validate import Limits

log = logging.getLogger(__name__)

CHUNK_BYTES = 4 << 20      # a poll's records are decoded this many message bytes at a time
POLL_RETRY_SECONDS = 0.5   # the pause after a poll failed with a retriable client error


class KafkaRun:
    """One consumer's run: buffers per assigned partition, flush, commit, rebalance hooks."""

    def __init__(self, settings, store: EventStore, default_kinds: dict, *, group_id: str,
                 flush_events: int, flush_interval: float, max_poll_records: int,
                 max_message_bytes: int, progress: bool, stop_event: threading.Event):
        self.settings, self.store, self.default_kinds = settings, store, default_kinds
        self.group_id = group_id
        self.flush_events, self.flush_interval = flush_events, flush_interval
        self.max_poll_records, self.max_message_bytes = max_poll_records, max_message_bytes
        self.progress, self.stop_event = progress, stop_event
        self.buffers: dict = {}
        self.summary = IngestSummary()
        self.consumer = None
        self.publisher = None
        self.joined = False
        self.bar = None
        self.ends: dict = {}
        self.lock = threading.Lock()
        self.pending: list = []
        self.failed = False   # after an error nothing more is flushed or committed
        self.limits = Limits.from_settings(settings)
        self.inflight: dict = {}   # tp -> (future of SegmentGroup.write, last offset)
        self.dropped: set = set()  # partitions sent back to the store's end during this poll
        self.writer: ThreadPoolExecutor | None = None
        self.stored_as: dict = {}  # tp -> the store's name of its topic (its generation)

    # -- Kafka clients

    def _consumer(self, config: dict):
        from kafka import KafkaConsumer

        consumer = KafkaConsumer(
            bootstrap_servers=self.settings.kafka_bootstrap, group_id=self.group_id,
            client_id=f"rankstream-ingest-{os.getpid()}", enable_auto_commit=False,
            auto_offset_reset="earliest",
            **{k: v for k, v in config.items() if v is not None},
            **self.settings.kafka_security)
        consumer.subscribe(sorted(self.default_kinds), listener=_listener(self))
        return consumer

    def _publisher(self):
        if self.publisher is None:
            from kafka import KafkaProducer

            from pipeline.ingest.dead_letters import DeadLetterPublisher

            producer = KafkaProducer(bootstrap_servers=self.settings.kafka_bootstrap,
                                     client_id=f"rankstream-dead-letter-{os.getpid()}",
                                     linger_ms=20, max_block_ms=15_000,
                                     max_request_size=DEAD_LETTER_MAX_BYTES + (64 << 10),
                                     **self.settings.kafka_security)
            self.publisher = DeadLetterPublisher(self.settings.dead_letter_topic, producer)
        return self.publisher

    # -- partition lifecycle (called by the rebalance listener on kafka-python's IO thread)
    #
    # on_partitions_revoked runs while the main thread waits inside poll() or close(), so it
    # flushes directly (blocking heartbeats for the flush, bounded by flush_events; the commit
    # is sent async since a blocking one would wait for the IO thread itself). An assignment
    # can complete after poll() has returned, i.e. while the main thread works: the listener
    # seeks (what kafka-python expects it to do) and queues the new buffers for the main thread.

    def assigned(self, partitions) -> None:
        resumes = {}
        for tp in partitions:
            name = self.stored_as[tp] = self.store.generation(tp.topic, tp.partition)
            self.store.recover(name, tp.partition)
            resumes[tp] = self.store.next_offset(name, tp.partition)
            if resumes[tp] is None:
                self.consumer.seek_to_beginning(tp)
            else:
                self.consumer.seek(tp, resumes[tp])
            log.info("assigned %s/%s, resuming at %s", tp.topic, tp.partition,
                     "the beginning" if resumes[tp] is None else resumes[tp])
        with self.lock:
            self.pending.append(("assigned", resumes))
        self.joined = True

    def revoked(self, partitions) -> None:
        """Flush what the revoked partitions buffered, unless the run failed: then the buffers
        are dropped unflushed (the next owner reads those offsets again from the store's end);
        an error path never writes or commits."""
        self.apply_pending()
        for tp in partitions:
            try:
                if not self.failed:
                    self.flush(tp, blocking_commit=False)
            except BaseException:
                self.failed = True
                raise
            finally:
                self.buffers.pop(tp, None)

    def lost(self, partitions) -> None:
        with self.lock:       # the new owner reads them again from the store's end
            self.pending.append(("lost", set(partitions)))

    def _recreated(self, resumes: dict) -> list:
        """Partitions (of ``{tp: the store's next offset}``) whose log ends before what the
        store holds from them: their topic was deleted and created again, its offsets
        restarted at 0. Each is switched to a new generation in the store and read from its
        beginning, beside the old events, and the run says so loudly."""
        known = {tp: n for tp, n in resumes.items() if n}
        ends = self.consumer.end_offsets(list(known)) if known else {}
        found = [tp for tp, n in known.items() if ends.get(tp) is not None and ends[tp] < n]
        for tp in found:
            new = self.stored_as[tp] = self.store.next_generation(tp.topic, tp.partition)
            log.error("%s/%s was re-created: its log ends at offset %s but the store holds "
                      "offsets up to %s from the topic before; storing its events as %s from "
                      "its beginning (the old events stay)", tp.topic, tp.partition, ends[tp],
                      known[tp] - 1, new)
            self.summary.recreated.append(f"{tp.topic}/{tp.partition} -> {new}")
            self.buffers[tp] = self._buffer(tp)
            self.dropped.add(tp)          # this poll's records of tp come again from 0
            self.consumer.seek_to_beginning(tp)
        return found

    def apply_pending(self) -> None:
        """Create the buffers of new partitions, drop those of lost ones; a new partition whose
        topic was re-created starts a new generation (main thread)."""
        with self.lock:
            events, self.pending = self.pending, []
        for what, partitions in events:
            if what == "assigned":
                for tp in self._recreated(partitions):
                    partitions[tp] = 0
            for tp in partitions:
                if what == "lost":
                    self.buffers.pop(tp, None)
                    continue
                self.buffers[tp] = self._buffer(tp)
                if tp in self.ends and self.bar is not None:
                    self.bar.total = ((self.bar.total or 0)
                                      + max(0, self.ends[tp] - (partitions[tp] or 0)))
                    self.bar.refresh()

    def _buffer(self, tp) -> PartitionBuffer:
        return PartitionBuffer(self.stored_as.get(tp, tp.topic), tp.partition,
                               self.default_kinds.get(tp.topic), self.max_message_bytes,
                               self.limits)

    # -- flushing

    def flush(self, tp, blocking_commit: bool = True, wait: bool = True) -> None:
        """Hand the partition's buffer to the writer thread (after settling the group it has in
        flight, if any); with ``wait``, also settle this one before returning."""
        self.settle(tp, blocking_commit)
        buf = self.buffers.get(tp)
        if buf is None or buf.empty:
            return
        group = buf.detach()
        publisher = self._publisher() if group.dead is not None else None
        self.inflight[tp] = (self.writer.submit(group.write, self.store, publisher), group.last)
        if wait:
            self.settle(tp, blocking_commit)

    def settle(self, tp, blocking_commit: bool = True) -> None:
        """Wait for the partition's group in flight; once it is durable, count it and commit the
        offset after it. A group the store refused (``OverlapError``) is dropped with what the
        partition buffered since, and the consumer resumes at the store's end. Any other error
        is raised (the run fails; nothing after it is committed)."""
        entry = self.inflight.pop(tp, None)
        if entry is None:
            return
        future, last = entry
        try:
            flushed = future.result()
        except OverlapError as err:
            buf = self.buffers.get(tp)
            if buf is not None:
                buf.detach()
            self.dropped.add(tp)      # and the rest of this poll's records of tp
            if tp not in self.consumer.assignment():
                return
            name = self.stored_as.get(tp, tp.topic)
            stored = self.store.next_offset(name, tp.partition) or 0
            if self._recreated({tp: stored}):
                return
            log.warning("%s; dropping the buffer and resuming after the stored offsets", err)
            self.consumer.seek(tp, stored)
            return
        self.summary.add(flushed)
        self._commit({tp: last + 1}, blocking_commit)
        if self.bar is not None:
            self.bar.set_postfix(events=sum(self.summary.events.values()),
                                 dead=sum(self.summary.dead_letters.values()), refresh=False)

    def settle_done(self) -> None:
        """Settle the groups whose writes have finished (main thread, between polls; their
        commits are sent without waiting: the last one of a run waits)."""
        for tp, (future, _) in list(self.inflight.items()):
            if future.done():
                self.settle(tp, blocking_commit=False)

    def commit_store_ends(self) -> None:
        """At a clean end, commit the store's end for every assigned partition, so that lag
        monitoring is right also for a partition that got nothing new in this run while an
        earlier run stored up to its end but failed before its commit went out."""
        assigned = self.consumer.assignment()
        names = {tp: self.stored_as.get(tp, tp.topic) for tp in assigned}
        ends = self.store.next_offsets(set(names.values()))   # one listing
        offsets = {tp: ends[(names[tp], tp.partition)] for tp in assigned
                   if (names[tp], tp.partition) in ends}
        if offsets:
            self._commit(offsets, blocking=True)

    def _commit(self, offsets: dict, blocking: bool) -> None:
        """Commit ``{partition: offset}`` for lag monitoring only: the store decides where a
        consumer resumes."""
        from kafka.structs import OffsetAndMetadata

        def failed(err):
            log.warning("offset commit of %s failed: %s", ", ".join(
                f"{tp.topic}/{tp.partition} at {offset}" for tp, offset in offsets.items()), err)

        committed = {tp: OffsetAndMetadata(offset, "", -1) for tp, offset in offsets.items()}
        try:
            if blocking:
                self.consumer.commit(committed)
            else:
                self.consumer.commit_async(
                    committed, callback=lambda _, result: failed(result)
                    if isinstance(result, Exception) else None)
        except Exception as err:
            failed(err)

    def flush_due(self) -> None:
        now = time.monotonic()
        for tp, buf in list(self.buffers.items()):
            if not buf.empty and (len(buf) >= self.flush_events
                                  or now - buf.started >= self.flush_interval):
                self.flush(tp, blocking_commit=False, wait=False)

    # -- the loop

    def run(self, config: dict, until_end: bool, timeout: float | None) -> IngestSummary:
        started = time.monotonic()
        self.writer = ThreadPoolExecutor(max_workers=1, thread_name_prefix="rankstream-flush")
        self.consumer = self._consumer(config)
        self.ends = ends = self._end_offsets() if until_end else {}
        self.bar = progress_bar(self.progress, total=None)
        try:
            self.summary.stopped = self._loop(ends, until_end, started, timeout)
            for tp in list(self.buffers):
                self.flush(tp, wait=False)
            for tp in list(self.inflight):
                self.settle(tp, blocking_commit=False)   # commit_store_ends waits for all
            self.commit_store_ends()
        except BaseException:
            # nothing more is flushed or committed: closing the consumer below revokes its
            # partitions, and a revoke must not flush buffers this error left behind
            self.failed = True
            raise
        finally:
            try:
                self.bar.close()
                self.consumer.close(autocommit=False)
            finally:
                # a write still in flight after an error finishes (whole, or not at all) before
                # this returns; its offsets are not committed: the store's end is where the
                # next run resumes
                self.writer.shutdown(wait=True)
                if self.publisher is not None:
                    self.publisher.close()
        self.summary.seconds = time.monotonic() - started
        return self.summary

    def _end_offsets(self) -> dict:
        from kafka.structs import TopicPartition

        partitions = [TopicPartition(topic, p) for topic in self.default_kinds
                      for p in sorted(self.consumer.partitions_for_topic(topic) or ())]
        return self.consumer.end_offsets(partitions) if partitions else {}

    def _loop(self, ends: dict, until_end: bool, started: float, timeout: float | None) -> str:
        while True:
            if self.stop_event.is_set():
                return "stop requested"
            if timeout is not None and time.monotonic() - started > timeout:
                return f"timeout after {timeout:g} s"
            records = self._poll()
            self.dropped.clear()
            self.apply_pending()
            self.settle_done()
            for tp, batch in records.items():
                if until_end and batch[-1].offset >= ends.get(tp, 0):
                    batch = [r for r in batch if r.offset < ends.get(tp, 0)]
                # in chunks, so that a full buffer goes to the writer thread while the rest of
                # a large poll is decoded
                for chunk in _chunks(batch, CHUNK_BYTES):
                    if tp in self.dropped:   # the consumer went back: these come again
                        break
                    buf = self.buffers.get(tp)
                    if buf is None:   # never skip records: that would leave a gap in the store
                        buf = self.buffers[tp] = self._buffer(tp)
                    buf.add_messages([r.value for r in chunk], [r.offset for r in chunk])
                    self.summary.messages += len(chunk)
                    self.bar.update(len(chunk))
                    self.flush_due()
            self.flush_due()
            if until_end and self.joined and self._drained(ends):
                return "end offsets reached"

    def _poll(self) -> dict:
        """One ``poll``; a retriable client error (a broker gone mid-run: kafka-python raises
        its metadata refresh's ``KafkaConnectionError`` from ``poll`` while the cluster elects
        a new leader) is logged and answers no records, so the loop polls again after a pause
        instead of ending the run; any other error ends it."""
        from kafka.errors import KafkaError

        try:
            return self.consumer.poll(timeout_ms=500, max_records=self.max_poll_records)
        except KafkaError as err:
            if not getattr(err, "retriable", False):
                raise
            log.warning("poll failed (%s): polling again in %.1f s", err, POLL_RETRY_SECONDS)
            self.stop_event.wait(POLL_RETRY_SECONDS)
            return {}

    def _drained(self, ends: dict) -> bool:
        """Whether every partition of the topics is drained to its end offset at the start:
        by this consumer (its position), or, for a partition it is not assigned, by another
        member of the group (the store's end). A member handed no partitions while its group
        rebalances must not call the topics drained: they are not, and it would stop with
        nothing done."""
        assignment = self.consumer.assignment()
        if not all(self.consumer.position(tp) >= ends.get(tp, 0) for tp in assignment):
            return False
        others = [tp for tp in ends if tp not in assignment and ends[tp] > 0]
        for tp in others:
            name = self.stored_as.get(tp) or self.store.generation(tp.topic, tp.partition)
            if (self.store.next_offset(name, tp.partition) or 0) < ends[tp]:
                return False
        return True


def _chunks(records: list, max_bytes: int):
    """``records`` in consecutive runs of about ``max_bytes`` bytes of values (at least one
    record each)."""
    start, size = 0, 0
    for i, record in enumerate(records):
        size += record.serialized_value_size
        if size >= max_bytes:
            yield records[start:i + 1]
            start, size = i + 1, 0
    if start < len(records):
        yield records[start:]


def _listener(run: KafkaRun):
    """A kafka-python rebalance listener that hands partition changes to ``run``."""
    from kafka import ConsumerRebalanceListener

    class Listener(ConsumerRebalanceListener):
        def on_partitions_revoked(self, revoked):
            run.revoked(revoked)

        def on_partitions_assigned(self, assigned):
            run.assigned(assigned)

        def on_partitions_lost(self, lost):
            run.lost(lost)

    return Listener()
