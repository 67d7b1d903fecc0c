"""A consumer's place in its group: a static member id per process slot, leaving the group
cleanly, stopping on signals, and the group settings that make a rebalance quick.

Examples
--------
>>> from pipeline.ingest.kafka_group import new_group_id
>>> new_group_id("backfill").startswith("backfill-")
True
"""

from __future__ import annotations

import fcntl
import getpass
import logging
import re
import signal
import socket
import threading
import uuid
from contextlib import contextmanager

log = logging.getLogger(__name__)

# heartbeat_interval_ms: a member learns that its group is rebalancing (another consumer
# joined) from its next heartbeat, so this bounds how long a joining consumer waits for
# partitions; kafka-python's default of 3 s is longer than an --until-end run of a million
# events. metadata_max_age_ms: a group leader assigns a subscribed topic it has no metadata for
# (one just created) only after its next metadata refresh; kafka-python's default is 5 minutes.
# At these rates both cost a broker next to nothing.
GROUP_CONFIG = {"heartbeat_interval_ms": 250, "metadata_max_age_ms": 5000}


@contextmanager
def member_slot(group_id: str, instance_id: str | None = None):
    """Yield the static member id of this consumer: ``instance_id`` if given, else
    ``rankstream-<host>-<user>-<group>-<slot>`` where slot is the lowest number whose lock file
    (in the user's state directory) this process can hold. A consumer restarted after a crash
    gets the dead one's slot, hence its id, and the broker hands it the same partitions at
    once (without static membership it sat idle until the dead member's session expired, 45 s
    by default); consumers running at the same time on one host hold different slots, so they
    never fence each other."""
    if instance_id is not None:
        yield instance_id
        return
    from pipeline.settings import state_dir

    safe = re.sub(r"[^A-Za-z0-9._-]", "_", f"{socket.gethostname()}-{getpass.getuser()}")
    group = re.sub(r"[^A-Za-z0-9._-]", "_", group_id)
    directory = state_dir("members")
    for slot in range(4096):
        fh = open(directory / f"{group}.{slot}.lock", "a+b")
        try:
            fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            fh.close()
            continue
        try:
            yield f"rankstream-{safe}-{group}-{slot}"[:249]
        finally:
            fh.close()   # releases the lock
        return
    raise RuntimeError(f"no free consumer slot for group {group_id!r} in {directory}")


def leave_group(settings, group_id: str, member: str) -> None:
    """Remove a static member that stopped cleanly from its group (static members never send
    LeaveGroup themselves), so that the others take its partitions at once."""
    from kafka.admin import KafkaAdminClient, MemberToRemove

    try:
        admin = KafkaAdminClient(bootstrap_servers=settings.kafka_bootstrap,
                                 **settings.kafka_security)
        try:
            admin.remove_group_members(group_id, [MemberToRemove(group_instance_id=member)])
        finally:
            admin.close()
    except Exception as err:  # the session timeout removes it anyway
        log.warning("could not remove member %s from group %s: %s", member, group_id, err)


@contextmanager
def stop_on_signals(event: threading.Event):
    """Within the block, SIGTERM and SIGINT set ``event`` (main thread only)."""
    saved = {}
    if threading.current_thread() is threading.main_thread():
        for sig in (signal.SIGTERM, signal.SIGINT):
            saved[sig] = signal.signal(sig, lambda *_: event.set())
    try:
        yield
    finally:
        for sig, handler in saved.items():
            signal.signal(sig, handler)


def new_group_id(prefix: str = "rankstream-ingest") -> str:
    """A fresh consumer group name (tests, benchmarks, one-off backfills)."""
    return f"{prefix}-{uuid.uuid4().hex[:12]}"


def never_auto_create(client) -> None:
    """Make ``client``'s metadata requests ask the broker not to auto-create what they name.
    kafka-python 3.0.12 drops its own ``allow_auto_create_topics=False`` on the way (its
    connection manager makes the cluster metadata with the default, True): a refresher's
    topic deleted to be made again came back 40 ms later with the broker's one partition,
    made by this reader's next metadata request (seen in ``tests/refresh``). A release that
    passes the setting on leaves nothing here to change."""
    config = getattr(getattr(getattr(client, "_client", None), "cluster", None), "config", None)
    if isinstance(config, dict) and "allow_auto_create_topics" in config:
        config["allow_auto_create_topics"] = False
