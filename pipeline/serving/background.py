"""Batch work beside latency-bound work: run a call in a thread whose CPU priority is lowered,
so that on a host it shares with lookups (a refresher, serve workers, Redis itself) it takes
the CPU they leave, not the CPU they need.

On two cores, a process spinning at niceness 0 beside a redis-server that serves lookups put
the lookups' p99 at 11x idle, and one at niceness 10 at 19x; at niceness 19 at 0.97x
(``bench/publish_load.py``). Linux gives each thread its own niceness, and a process may raise
a niceness but not lower it again, hence a thread of its own for the call; threads it starts
inherit the niceness. Elsewhere (and where the thread is already at least that nice) the call
runs at the priority it has.

Examples
--------
>>> run_at_niceness(sum, [1, 2, 3])
6
"""

from __future__ import annotations

import os
import sys
import threading

BATCH_NICENESS = 19   # the lowest CPU priority a Linux thread can take


def run_at_niceness(fn, *args, niceness: int | None = BATCH_NICENESS, **kwargs):
    """``fn(*args, **kwargs)`` in a thread at ``niceness`` (None: in this thread, as is);
    returns what it returns and raises what it raises."""
    if niceness is None or not sys.platform.startswith("linux"):
        return fn(*args, **kwargs)
    outcome: dict = {}

    def call() -> None:
        tid = threading.get_native_id()
        try:
            if os.getpriority(os.PRIO_PROCESS, tid) < niceness:
                os.setpriority(os.PRIO_PROCESS, tid, niceness)
            outcome["value"] = fn(*args, **kwargs)
        except BaseException as exc:      # re-raised in the caller's thread
            outcome["error"] = exc

    worker = threading.Thread(target=call, name=f"niceness-{niceness}", daemon=True)
    worker.start()
    worker.join()
    if "error" in outcome:
        raise outcome["error"]
    return outcome["value"]
