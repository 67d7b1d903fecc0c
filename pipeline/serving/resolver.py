"""Which published version a lookup reads: the version ``current`` names (its immutable item
ids, factors and scorer cached per version), and the check that every bucket pointer a batch
read names that version, so that no answer mixes versions (``REDIS_LAYOUT.md``).

A version that vanishes while it is read (pruned after a newer publish), or a batch whose
pointers name different versions (a pointer move under way), is read again: :meth:`retrying`
runs an attempt up to ``ATTEMPTS`` times, after a short wait when pointers straddle, and from
attempt ``REPAIR_AT`` on moves the pointers itself (the publisher may have died between its
flip and the pointers).
"""

from __future__ import annotations

import threading
import time

from pipeline.serving.layout import (
    BUCKETS,
    LayoutError,
    ModelKeys,
    UnknownModelError,
    parse_pointer,
)
from pipeline.serving.transport import Transport
from pipeline.serving.version_cache import Vanished, VersionState, load_version_state

ATTEMPTS = 10  # re-resolutions when versions vanish or a batch straddles a pointer move
REPAIR_AT = 5  # attempt at which a batch still straddling moves the pointers itself
CACHED_VERSIONS = 16


class Straddles(Vanished):
    """A batch's bucket pointers name different versions (or some are missing): a pointer
    move is under way; ask again shortly."""


class VersionResolver:
    """The versions of the models one client reads, under ``namespace``."""

    def __init__(self, transport: Transport, namespace: str):
        self.transport, self.namespace = transport, namespace
        self.current: dict[str, VersionState] = {}   # model -> last version seen current
        self._keys: dict[str, ModelKeys] = {}
        self._states: dict[str, VersionState] = {}  # "{tag}|version:publish id" -> state
        self._lock = threading.Lock()

    def keys(self, model: str) -> ModelKeys:
        keys = self._keys.get(model)
        if keys is None:
            keys = self._keys[model] = ModelKeys(self.namespace, model)
        return keys

    def state(self, keys: ModelKeys, raw: bytes, key: str | None = None) -> VersionState:
        """The (cached) state of the version a ``current``/pointer value names."""
        version, publish_id, _ = parse_pointer(raw, key or keys.current)
        cache_key = f"{keys.tag}|{version}:{publish_id}"
        st = self._states.get(cache_key)
        if st is None:
            st = load_version_state(self.transport.bulk, keys, raw, key)
            with self._lock:
                if len(self._states) >= CACHED_VERSIONS:
                    self._states.pop(next(iter(self._states)))
                self._states[cache_key] = st
        return st

    def current_state(self, model: str) -> VersionState:
        """The state of the version ``current`` names now (one round trip once cached)."""
        import redis

        keys = self.keys(model)
        try:
            raw = self.transport.send(keys, BUCKETS, [("GET", keys.current)])[0]
        except redis.ResponseError as err:
            raise LayoutError(f"{keys.current} is not a string key ({err})") from None
        if raw is None:
            raise UnknownModelError(f"model {model!r} has no published version in namespace "
                                    f"{self.namespace!r} at {self.transport.where} "
                                    f"({keys.current} does not exist)")
        st = self.state(keys, raw)
        self.current[model] = st
        return st

    def check_pointers(self, st: VersionState, pointers: list) -> None:
        """Return when every pointer names ``st``; else follow the newest one (the version
        lookups use from now on) and raise :class:`Vanished` to ask again, or
        :class:`Straddles` when the pointers name different versions (a pointer move in
        progress) or some are missing."""
        if all(map(st.names, pointers)):
            return
        keys = st.keys
        if any(p is None for p in pointers):
            self.current_state(keys.model)   # UnknownModelError when nothing is published
            raise Straddles(st.version)
        where = f"a bucket pointer of {keys.tag}"
        parsed = [(parse_pointer(p, where)[2], p) for p in pointers]
        newest = max(parsed)[1]
        self.current[keys.model] = self.state(keys, newest, where)
        if len({p[:p.rindex(b":")] for _, p in parsed}) > 1:
            raise Straddles(st.version)
        raise Vanished(st.version)

    def retrying(self, model: str, attempt):
        """``attempt()``, again while versions vanish under it or a batch straddles a pointer
        move (see the module docstring)."""
        straddled = 0
        for n in range(ATTEMPTS):
            try:
                return attempt()
            except Straddles:
                straddled += 1
                if n >= REPAIR_AT:
                    self.repair(model)
                time.sleep(min(0.001 * 2 ** n, 0.1))
            except Vanished:
                continue
        if straddled:
            raise LayoutError(f"model {model!r}: the bucket pointers did not agree on one version "
                              f"in {ATTEMPTS} tries (a pointer move that does not finish: run "
                              "`rankstream rollback --to <current version>` to move them)")
        raise LayoutError(f"model {model!r}: the current version vanished {ATTEMPTS} times "
                          "while being read (publishing faster than versions are kept?)")

    def repair(self, model: str) -> None:
        """Best effort: copy ``current`` to the bucket pointers behind it (a reader on a replica
        cannot; then only a publish or rollback will)."""
        from pipeline.serving.versions import sync_pointers

        try:
            sync_pointers(self.transport.bulk, self.keys(model), attempts=1)
        except Exception:
            pass
