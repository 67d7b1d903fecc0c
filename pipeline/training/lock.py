"""One retrain of a model at a time: an ``flock`` on ``HOME/locks/<model>.lock``, which the
kernel releases when its process dies (no stale lock after a crash or SIGKILL), and, when the
run publishes to Redis, the model's Redis lease (:mod:`pipeline.serving.lease`), which holds
across hosts and gives the run the fencing token its publish flip is checked against.

Examples
--------
>>> import tempfile
>>> from pipeline.settings import Settings
>>> settings = Settings(home=tempfile.mkdtemp())
>>> with model_lock(settings, "movies"):
...     try:
...         with model_lock(settings, "movies"):
...             pass
...     except ModelBusyError as err:
...         print(str(err).split(";")[0][:36])
model 'movies' is being retrained by
"""

from __future__ import annotations

import fcntl
import os
import socket
import time
from contextlib import contextmanager
from datetime import datetime, timezone
from pathlib import Path


class ModelBusyError(RuntimeError):
    """Another process is retraining the model."""


@contextmanager
def model_lock(settings, model: str, *, wait: float = 0.0, redis_url: str | None = None):
    """Hold the model's retrain lock within the block, and with ``redis_url`` its Redis lease
    too (kept alive by a thread); yields the lease (its ``token`` is the fence to publish with)
    or None. If another run holds either, wait up to ``wait`` seconds (0: not at all) for it,
    then raise :class:`ModelBusyError` naming the holder."""
    started = time.monotonic()
    with _flock(settings, model, wait) as holder:
        if redis_url is None:
            yield None
            return
        from pipeline.serving.lease import Lease, LeaseHeldError

        try:
            lease = Lease.acquire(redis_url, settings.namespace, model,
                                  holder=f"{holder}\t{_process_space()}", ttl=settings.lease_ttl,
                                  wait=max(0.0, wait - (time.monotonic() - started)),
                                  is_dead=_dead_here)
        except LeaseHeldError as err:
            raise ModelBusyError(str(err)) from None
        try:
            yield lease.keep_alive()
        finally:
            lease.release()


def _process_space() -> str:
    """Which process ids this process shares: the kernel's boot id and its pid namespace. Two
    containers on one host share a boot id and (often) a hostname, but not a pid namespace."""
    try:
        boot = Path("/proc/sys/kernel/random/boot_id").read_text().strip()
        return f"{boot}:{os.stat('/proc/self/ns/pid').st_ino}"
    except OSError:
        return ""


def _dead_here(holder: str) -> bool:
    """Whether a lease's holder ("pid N on HOST since T<tab>SPACE") is a process of this
    machine's pid namespace that no longer exists: a run killed here (SIGKILL, OOM) then frees
    its model at once, as the ``flock`` does, instead of after the lease's TTL. Anything else
    (another host or container, a pid now reused, a holder of another format) counts as alive.

    >>> _dead_here(f"pid {os.getpid()} on h since t\t{_process_space()}")
    False
    >>> _dead_here("pid 1 on another host since t\tother-space")
    False
    """
    shown, _, space = holder.partition("\t")
    words = shown.split()
    if not space or space != _process_space() or len(words) < 2 or not words[1].isdigit():
        return False
    try:
        os.kill(int(words[1]), 0)
    except ProcessLookupError:
        return True
    except OSError:     # alive, another user's
        return False
    return False


@contextmanager
def _flock(settings, model: str, wait: float):
    """The host-local lock; yields who holds it ("pid N on HOST since T")."""
    path = Path(settings.home) / "locks" / f"{model}.lock"
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a+", encoding="utf-8") as fh:
        deadline = time.monotonic() + wait
        while True:
            try:
                fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    fh.seek(0)
                    holder = fh.read().strip() or "another process"
                    raise ModelBusyError(
                        f"model {model!r} is being retrained by {holder}; let it finish, or "
                        "wait for it (rankstream train --wait)") from None
                time.sleep(0.2)
        holder = (f"pid {os.getpid()} on {socket.gethostname()} since "
                  f"{datetime.now(timezone.utc).isoformat(timespec='seconds')}")
        fh.seek(0)
        fh.truncate()
        fh.write(holder)
        fh.flush()
        try:
            yield holder
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)
