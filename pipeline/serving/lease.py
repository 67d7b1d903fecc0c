"""A model's retrain lease in Redis: one retrain per model across hosts, with a fencing token.

``acquire`` takes the next token from ``<tag>:lease_seq`` (INCR) and sets ``<tag>:lease`` to
``"<token> <holder>"`` only if no one holds it (``SET NX PX``); while the run lives a thread
renews the TTL, but only while the value is still its own (a Lua compare-and-expire), and the
run releases it at the end the same way (compare-and-delete). The publish flip
(:func:`pipeline.serving.versions.flip` with ``fence=token``) checks, in the same script that
moves ``current``, that the lease still holds the token. A run that lost its lease (its process
paused past the TTL, its host cut off, an operator's ``rankstream lease revoke``) therefore
cannot publish over the run that took the lease after it, even if it wakes up mid-flip: tokens
only grow, and the check and the flip are one atomic script on the model's own slot.

Why a TTL and not a lock held forever: a host that dies holding the lease frees it after the
TTL with nobody's help. The TTL is the longest a dead holder blocks the next run, and the
renew interval (a third of it) how long a live one may stall before it loses the lease. A
holder that is known to be dead sooner (``is_dead``: a process of this very machine that no
longer exists, see :mod:`pipeline.training.lock`) does not block even that long: its lease is
taken back at once, with a compare-and-delete of exactly the value it left.

Examples
--------
>>> from pipeline.serving.embedded_redis import EmbeddedRedis
>>> with EmbeddedRedis() as server:
...     first = Lease.acquire(server.url, "rankstream", "movies", holder="host a")
...     try:
...         Lease.acquire(server.url, "rankstream", "movies", holder="host b")
...     except LeaseHeldError as err:
...         print(str(err).split(";")[0])
...     first.release()
...     second = Lease.acquire(server.url, "rankstream", "movies", holder="host b")
...     print(first.token < second.token, second.held())
...     second.release()
model 'movies' is held by host a (lease token 1)
True True
"""

from __future__ import annotations

import threading
import time

from pipeline.serving.layout import ModelKeys
from pipeline.serving.redis_client import as_client

LEASE_TTL = 30.0     # seconds a lease lives without renewal

# KEYS: lease;  ARGV: "<token> ", ttl ms. Extends the TTL only of the holder's own lease.
RENEW = """
local v = redis.call('GET', KEYS[1])
if v and string.sub(v, 1, string.len(ARGV[1])) == ARGV[1] then
  return redis.call('PEXPIRE', KEYS[1], ARGV[2])
end
return 0
"""
# KEYS: lease;  ARGV: "<token> ". Deletes the lease only if it is still the holder's.
RELEASE = """
local v = redis.call('GET', KEYS[1])
if v and string.sub(v, 1, string.len(ARGV[1])) == ARGV[1] then
  return redis.call('DEL', KEYS[1])
end
return 0
"""


# KEYS: lease;  ARGV: the whole value. Deletes the lease only if it still holds exactly that.
BREAK = """
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('DEL', KEYS[1])
end
return 0
"""


class LeaseHeldError(RuntimeError):
    """Another run holds the model's lease."""


class Lease:
    """A held lease: ``token`` (the fencing token to publish with), ``renew()``,
    ``release()``, ``held()``; :meth:`keep_alive` renews it from a thread."""

    def __init__(self, client, keys: ModelKeys, token: int, holder: str, ttl: float):
        self.client, self.keys, self.token, self.holder, self.ttl = (client, keys, token,
                                                                      holder, ttl)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    @classmethod
    def acquire(cls, redis, namespace: str, model: str, *, holder: str,
                ttl: float = LEASE_TTL, wait: float = 0.0, is_dead=None) -> Lease:
        """Take the model's lease, waiting up to ``wait`` seconds for the holder to let go;
        :class:`LeaseHeldError` naming the holder when it does not. ``holder`` is shown in
        that message up to its first tab (what follows is for ``is_dead``); ``is_dead(holder)``
        says whether the holder of a lease is certainly gone, so that its lease is taken back
        now rather than after its TTL."""
        client = as_client(redis, retries=3)
        keys = ModelKeys(namespace, model)
        deadline = time.monotonic() + wait
        while True:
            token = int(client.incr(keys.lease_seq))
            if client.set(keys.lease, f"{token} {holder}", nx=True, px=int(ttl * 1000)):
                return cls(client, keys, token, holder, ttl)
            current = client.get(keys.lease)
            token_held, _, held_by = (current.decode(errors="replace") if current
                                      else "").partition(" ")
            if current and is_dead is not None and is_dead(held_by):
                client.eval(BREAK, 1, keys.lease, current)
                continue
            if time.monotonic() >= deadline:
                held_by = held_by.split("\t", 1)[0]
                raise LeaseHeldError(
                    f"model {model!r} is held by {held_by or 'another run'} (lease token "
                    f"{token_held or '?'}); let it finish, or wait for it (rankstream train "
                    "--wait)")
            time.sleep(0.2)

    def renew(self) -> bool:
        """Extend the TTL; False when the lease is no longer this run's."""
        return bool(self.client.eval(RENEW, 1, self.keys.lease, f"{self.token} ",
                                     int(self.ttl * 1000)))

    def held(self) -> bool:
        value = self.client.get(self.keys.lease)
        return value is not None and value.startswith(f"{self.token} ".encode())

    def release(self) -> None:
        """Stop renewing and give the lease back if it is still this run's."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=self.ttl)
        try:
            self.client.eval(RELEASE, 1, self.keys.lease, f"{self.token} ")
        except Exception:   # noqa: BLE001 - Redis gone: the TTL frees it
            pass

    def keep_alive(self) -> Lease:
        """Renew every third of the TTL from a daemon thread until :meth:`release` (or until
        the lease is lost: then the publish flip refuses this run's token)."""
        def loop():
            while not self._stop.wait(self.ttl / 3):
                try:
                    if not self.renew():
                        return
                except Exception:   # noqa: BLE001 - Redis unreachable: try again
                    continue

        self._thread = threading.Thread(target=loop, name=f"lease-{self.keys.model}",
                                        daemon=True)
        self._thread.start()
        return self


def revoke(redis, namespace: str, model: str) -> str | None:
    """Take the model's lease away from whoever holds it (its flip will be refused); returns
    what the lease held, or None."""
    client = as_client(redis, retries=3)
    keys = ModelKeys(namespace, model)
    value = client.getdel(keys.lease)
    return value.decode(errors="replace") if value is not None else None
