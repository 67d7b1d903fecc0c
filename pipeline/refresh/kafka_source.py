"""The refresher as a service: its own Kafka consumer group per model
(``rankstream.refresh.<model>``; ingest keeps its own, and the two never share offsets) on the
model's topics, feeding :class:`~pipeline.refresh.refresher.Refresher`.

Each poll's messages are decoded and validated as ingest does them (a bad message is skipped:
ingest dead-letters it); the touched users are recomputed and written in batches, and every
``batch_ms`` the offsets of what was applied are committed.

A batch is what arrived while the last one was being written: as soon as a poll comes back
short of :data:`MAX_RECORDS` (the consumer has caught up) and :data:`MIN_GAP_SECONDS` have
passed, the touched users are recomputed; while a backlog drains, every ``batch_ms``. So a
quiet stream answers within a poll and a write, and a busy one batches more users per write
(each user once per batch), which is what keeps up with it. A crash replays from the committed
offsets, and a replayed event recomputes its user from the whole history again, with the same
result.

Where a partition starts: at its committed offset, but never past the store's end or the
served version's watermark, so events that the store does not hold yet (ingest lags) are read
into the history again; those before the committed offset were applied already and only join
the history (no lag counted).
"""

from __future__ import annotations

import logging
import os
import queue
import threading
import time

from pipeline.heap import release_freed_memory
from pipeline.ingest.buffer import PartitionBuffer
from pipeline.ingest.events import default_topic
from pipeline.ingest.kafka_group import GROUP_CONFIG, leave_group, member_slot, never_auto_create
from pipeline.ingest.validate import Limits

log = logging.getLogger(__name__)

WATCH_SECONDS = 0.5      # how often ``current`` is checked (a flip, or Redis restarted empty)
STATS_SECONDS = 2.0
# how often the heap's freed pages go back to the OS (pipeline.heap): each batch frees what
# it decoded and computed between objects that stay, and glibc keeps those pages: at 2,000
# events/s 40-57 MiB every 10 s on ML-100K, a sawtooth as tall as 10 minutes of new data;
# a trim takes 2-3 ms there, so once a second
TRIM_SECONDS = 1.0
MIN_GAP_SECONDS = 0.05   # the shortest batch: what arrives meanwhile is recomputed together
MAX_RECORDS = 20_000     # one poll's most; a full poll means more is waiting
# a rebalance (partitions revoked) not finished after this long is given up: the consumer is
# closed and joins again. kafka-python 3.0 was seen to start a second generation's assignment
# ("Elected group leader -- performing partition assignments") and never finish it, the
# refresher then reading nothing; a member that joins again under its static id is assigned at
# once. Generous next to a normal rebalance here (under 1 s), short next to a user's patience.
REJOIN_SECONDS = 10.0
# a member that holds no partition of its topics (which have some) for this long joins again,
# past kafka-python's 10 s session timeout: a refresher left out of an assignment otherwise
# refreshes nobody and says nothing. Each idle rejoin doubles the wait, up to ORPHAN_MAX_SECONDS
# (with more refreshers than partitions, some are rightly idle)
ORPHAN_SECONDS = 15.0
ORPHAN_MAX_SECONDS = 600.0


class StalledRebalance(RuntimeError):
    """A rebalance that did not finish within :data:`REJOIN_SECONDS`, a member that held no
    partition for :data:`ORPHAN_SECONDS` or more, or a topic deleted and created again under
    it: the consumer joins again."""


def group_of(model: str) -> str:
    return f"rankstream.refresh.{model}"


class KafkaRefresh:
    """Consume the model's topics into ``refresher`` until ``stop`` is set."""

    def __init__(self, refresher, settings, *, batch_ms: int = 200,
                 stop: threading.Event | None = None, topics: dict | None = None,
                 group: str | None = None):
        self.refresher, self.settings = refresher, settings
        self.group = group or group_of(refresher.model)   # another: a test's own, say
        self.batch = batch_ms / 1000.0
        self.stop = stop or threading.Event()
        self.kinds = topics or {default_topic(k): k for k in refresher.cfg.kinds}  # topic: kind
        self.buffers: dict = {}
        self.taken: dict = {}           # TopicPartition -> next offset read, not yet written
        self.applied: dict = {}         # TopicPartition -> next offset to commit (written)
        self.replay_until: dict = {}    # TopicPartition -> committed offset at assignment
        self.consumer = None
        # partitions assigned, paused until placed: handed from the rebalance listener to the
        # loop through a thread-safe queue (the listener may run on kafka-python's IO thread)
        self.to_place: queue.SimpleQueue = queue.SimpleQueue()
        self.revoked_at: float | None = None   # a rebalance began here, and has not finished
        self.events_said = 0            # the refresher's event count at the last batch line
        self.empty_since: float | None = None   # holding no partition since
        self.orphan_wait = ORPHAN_SECONDS
        self.topic_ids: dict = {}       # topic -> its Kafka topic id when first seen

    def _consumer(self, member: str):
        from kafka import ConsumerRebalanceListener, KafkaConsumer

        outer = self

        class Listener(ConsumerRebalanceListener):
            # runs on kafka-python's IO thread, which must not block: commit asynchronously,
            # and pause new partitions until the main thread knows where each starts
            def on_partitions_revoked(self, revoked):
                outer.revoked_at = time.monotonic()
                outer._commit(wait=False)

            def on_partitions_assigned(self, assigned):
                outer.revoked_at = None
                if assigned:
                    consumer.pause(*assigned)       # its own consumer, whatever outer holds
                    for tp in assigned:
                        outer.to_place.put(tp)

        consumer = KafkaConsumer(
            bootstrap_servers=self.settings.kafka_bootstrap,
            group_id=self.group,
            client_id=f"rankstream-refresh-{os.getpid()}", enable_auto_commit=False,
            auto_offset_reset="earliest", group_instance_id=member, **GROUP_CONFIG,
            # a reader never creates what it reads: a topic deleted to be made again (with
            # more partitions, say) was made again at once by this consumer's metadata
            # requests, with the broker's default partitions, where it auto-creates topics
            allow_auto_create_topics=False, **self.settings.kafka_security)
        never_auto_create(consumer)
        # the group leader's first assignment covers only the topics its metadata knows: fetch
        # them first, or they are assigned in a second rebalance, which kafka-python was seen
        # not to finish (a refresher with no partitions, ever; twice in the Kafka tests)
        for topic in sorted(self.kinds):
            consumer.partitions_for_topic(topic)
        consumer.subscribe(sorted(self.kinds), listener=Listener())
        return consumer

    def _place(self) -> None:
        """Seek each newly assigned partition to where it starts (see the module), then
        resume it (main thread: ``committed`` blocks)."""
        from pipeline.refresh.refresher import watermark_of

        partitions = []
        while not self.to_place.empty():
            partitions.append(self.to_place.get_nowait())
        store, st = self.refresher.store, self.refresher.state
        marks = {(name, p): o for name, p, o in (watermark_of(st) or [])} if st else {}
        for tp in partitions:
            committed = self.consumer.committed(tp)
            name = store.generation(tp.topic, tp.partition)
            stored = store.next_offset(name, tp.partition) or 0   # nothing stored: from 0
            mark = marks.get((name, tp.partition))
            self.consumer.seek(tp, min(o for o in (committed, stored, mark) if o is not None))
            self.replay_until[tp] = committed or 0
            self.buffers[tp] = PartitionBuffer(tp.topic, tp.partition,
                                               default_kind=self.kinds.get(tp.topic),
                                               limits=Limits.from_settings(self.settings))
        self.consumer.resume(*partitions)
        self._hold()

    def _hold(self) -> None:
        """The refresher holds the histories of its partitions' users from now on
        (:mod:`pipeline.refresh.ownership`; every user's where it holds every partition)."""
        from pipeline.refresh.ownership import Ownership

        assigned: dict = {}
        for tp in self.consumer.assignment():
            assigned.setdefault(tp.topic, set()).add(tp.partition)
        counts = {t: len(self.consumer.partitions_for_topic(t) or ()) for t in self.kinds}
        self.refresher.hold(Ownership.of(assigned, counts))

    def _commit(self, wait: bool = True) -> None:
        from kafka.structs import OffsetAndMetadata

        if self.applied and self.consumer is not None:
            offsets = {tp: OffsetAndMetadata(o, None, -1) for tp, o in self.applied.items()}
            try:
                (self.consumer.commit if wait else self.consumer.commit_async)(offsets)
            except Exception as err:   # noqa: BLE001 - a rebalance: the next owner replays
                log.warning("refresh commit failed (%s: %s); the partitions' next owner "
                            "replays them", type(err).__name__, err)
            self.applied.clear()

    def _take(self, records: dict) -> dict:
        """Apply a poll's records; the next offsets they reach, per partition."""
        reached = {}
        for tp, messages in records.items():
            buf = self.buffers.get(tp)
            if buf is None or not messages:
                continue
            values = [m.value for m in messages]
            offsets = [m.offset for m in messages]
            live_from = self.replay_until.get(tp, 0)
            for live in (False, True):
                part = [i for i, o in enumerate(offsets) if (o >= live_from) == live]
                if part:
                    buf.add_messages([values[i] for i in part], [offsets[i] for i in part])
                    self.refresher.apply(buf.take_events(), (tp.topic, tp.partition),
                                         live=live)
            reached[tp] = offsets[-1] + 1
        return reached

    def _backlog(self) -> None:
        parts = list(self.buffers)
        if not parts:
            return
        ends = self.consumer.end_offsets(parts)
        self.refresher.stats.backlog = {
            f"{tp.topic}/{tp.partition}": max(0, ends.get(tp, 0) - self.consumer.position(tp))
            for tp in parts}

    def run(self) -> None:
        """Until ``stop``: poll, apply, recompute and write in batches, commit. A
        failure of Redis or Kafka is said in one line and the loop starts again a second later
        (from the committed offsets; the history kept in memory stays)."""
        while not self.stop.is_set():
            try:
                self._loop()
            except Exception as err:    # noqa: BLE001 - a service: say it, wait, go on
                from pipeline.settings import redact

                log.warning("%s: %s; starting again in 1 s", self.refresher.model,
                            redact(f"{type(err).__name__}: {err}"))
                self._close()
                self.stop.wait(1.0)

    def _close(self) -> None:
        consumer, self.consumer = self.consumer, None
        self.buffers, self.taken, self.applied = {}, {}, {}
        self.to_place = queue.SimpleQueue()
        if consumer is not None:
            try:
                consumer.close(autocommit=False)
            except Exception:           # noqa: BLE001 - closing a broken client
                pass

    def _loop(self) -> None:
        refresher = self.refresher
        while refresher.watch() == "none" and not self.stop.is_set():
            self.stop.wait(1.0)     # nothing served yet: nothing to refresh against
        # a static member id per process slot, as ingest's: a refresher restarted after a crash
        # takes the dead one's partitions at once, not after its 45 s session timeout
        group = self.group
        with member_slot(group) as member:
            try:
                self._run(member)
            except StalledRebalance:
                # a static member joining again is handed its last assignment without a
                # rebalance (what static membership is for): after a topic came back, an
                # empty one, forever (seen in tests/refresh). Leaving first makes the group
                # assign anew, from metadata that holds the topic's partitions now
                self._close()
                leave_group(self.settings, group, member)
                raise
            leave_group(self.settings, group, member)   # a clean stop hands them over now

    def _run(self, member: str) -> None:
        refresher = self.refresher
        refresher.stats.member = member      # its own stats file: several refreshers per host
        self.consumer, self.revoked_at, self.empty_since = self._consumer(member), None, None
        last_flush = last_commit = last_watch = last_stats = last_trim = time.monotonic()
        while not self.stop.is_set():
            records = self.consumer.poll(timeout_ms=int(MIN_GAP_SECONDS * 1000),
                                         max_records=MAX_RECORDS)
            self.taken.update(self._take(records))
            if not self.to_place.empty():
                self._place()
            now = time.monotonic()
            if self.revoked_at is not None and now - self.revoked_at > REJOIN_SECONDS:
                refresher.stats.rejoins += 1
                raise StalledRebalance(f"a rebalance of group {self.group} did not finish in "
                                       f"{REJOIN_SECONDS:g} s; joining it again")
            if now - last_watch >= WATCH_SECONDS:
                refresher.watch()
                last_watch = now
                recreated = self._recreated()
                if recreated:
                    refresher.stats.rejoins += 1
                    raise StalledRebalance(
                        f"{', '.join(recreated)} was deleted and created again (a new topic id); "
                        f"joining group {self.group} again to read it from its start")
                if self._orphaned(now):
                    refresher.stats.rejoins += 1
                    waited, self.orphan_wait = self.orphan_wait, min(2 * self.orphan_wait,
                                                                     ORPHAN_MAX_SECONDS)
                    raise StalledRebalance(
                        f"held no partition of {', '.join(sorted(self.kinds))} for {waited:g} s "
                        f"while they have some; joining group {self.group} again (with more "
                        "refreshers than partitions some stay idle, and this repeats less often)")
            caught_up = sum(map(len, records.values())) < MAX_RECORDS
            if (self.taken or refresher.pending or refresher.replay) and (
                    now - last_flush >= self.batch
                    or (caught_up and now - last_flush >= MIN_GAP_SECONDS)):
                self._flush()
                last_flush = now
            if now - last_commit >= self.batch:
                self._commit()
                last_commit = now
            if now - last_stats >= STATS_SECONDS:
                self._backlog()
                refresher.stats.write(self.settings.home)
                last_stats = now
            if now - last_trim >= TRIM_SECONDS:
                release_freed_memory()
                last_trim = now
        self._flush()
        self._commit()
        refresher.stats.write(self.settings.home)
        self._close()

    def _recreated(self) -> list[str]:
        """The topics whose Kafka topic id changed since this member first saw them: deleted
        and created again. Its offsets start at 0 again, and a consumer that kept its
        partitions through it would read on from the old topic's end, past events of the new
        one (kafka-python keeps the ids in its metadata, refreshed every few seconds)."""
        cluster = self.consumer._client.cluster
        changed = []
        for topic in sorted(self.kinds):
            now = cluster.topic_id(topic)
            if now is None:
                continue
            if self.topic_ids.setdefault(topic, now) != now:
                changed.append(topic)
                self.topic_ids[topic] = now
        return changed

    def _orphaned(self, now: float) -> bool:
        """Whether this member has held no partition for :attr:`orphan_wait` seconds, outside
        a rebalance, while its topics have partitions."""
        if self.consumer.assignment() or self.revoked_at is not None:
            self.empty_since = None
            if self.consumer.assignment():
                self.orphan_wait = ORPHAN_SECONDS
            return False
        if self.empty_since is None:
            self.empty_since = now
        if now - self.empty_since < self.orphan_wait:
            return False
        self.empty_since = None
        return any(self.consumer.partitions_for_topic(t) for t in self.kinds)

    def _flush(self) -> None:
        """Recompute and write the touched users; what was read is then written, to commit.
        One INFO line per batch that wrote users: how many, from how many events, the lag."""
        stats, users = self.refresher.stats, 0
        while True:
            written = self.refresher.flush()
            users += written
            if not (written and self.refresher.replay and not self.stop.is_set()):
                break    # else a flip's replay, batch by batch
        self.applied.update(self.taken)
        self.taken.clear()
        if users:
            events, self.events_said = stats.events - self.events_said, stats.events
            log.info("%s: refreshed %d user%s from %d event%s on version %s; lag %d events",
                     self.refresher.model, users, "s"[:users != 1], events,
                     "s"[:events != 1], stats.version, sum(stats.backlog.values()))
