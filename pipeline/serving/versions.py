"""Published versions of a model in Redis: flip ``current`` (publish and rollback), move the
bucket pointers after it, prune old ones. Every change of ``current`` is one Lua script
(:mod:`~pipeline.serving.version_scripts`) over keys that share the model's hash tag, so it is
atomic (and valid in Redis Cluster); each bucket pointer then follows with a compare-on-epoch
script in its own slot. Data keys are only deleted (:mod:`~pipeline.serving.version_delete`)
after their version left the version list *and* every bucket pointer has moved past it, so no
reader can be pointed at a half-deleted version (``REDIS_LAYOUT.md`` has the argument).
Reading what is published without changing it: :mod:`~pipeline.serving.version_listing`
(its names are importable from here too).

Examples
--------
>>> import redis  # doctest: +SKIP
>>> r = redis.Redis.from_url("redis://127.0.0.1:6379/0")  # doctest: +SKIP
>>> [v.version for v in versions("movies", r)]  # doctest: +SKIP
[5, 6, 7]
>>> rollback("movies", r)  # doctest: +SKIP
6
"""

from __future__ import annotations

import time
from datetime import datetime

from pipeline.serving.layout import (
    FORMAT_VERSION,
    ModelKeys,
    UnknownModelError,
    parse_current,
    parse_pointer,
)
from pipeline.serving.shards import NodeBatch
from pipeline.serving.version_delete import delete_version
from pipeline.serving.version_listing import (
    VersionInfo,
    age_seconds,
    answer_counts,
    current_raw,
    current_version,
    fallback_share,
    kept_versions,
    read_current,
    served_versions,
    versions,
)
from pipeline.serving.version_scripts import (
    DROP,
    FLIP,
    ROLLBACK,
    SET_POINTER,
    lua_error,
    run_script,
)

__all__ = ["SupersededError", "FencedError", "VersionInfo", "versions", "served_versions",
           "current_version", "read_current", "age_seconds", "fallback_share", "answer_counts",
           "sync_pointers", "flip", "rollback", "prune", "prune_versions", "delete_version",
           "FLIP", "ROLLBACK", "SET_POINTER", "DROP"]


class SupersededError(RuntimeError):
    """A newer version of the model went live while this one was being written."""


class FencedError(SupersededError):
    """The retrain's lease on the model was lost (expired or revoked) before its flip."""


def sync_pointers(client, keys: ModelKeys, value: bytes | str | None = None,
                  attempts: int = 3) -> int:
    """Copy ``current`` (or ``value``, a value it had) to every bucket pointer whose epoch is
    lower; returns how many moved. Idempotent, so anyone may run it at any time: publish and
    rollback after their flip, prune before it deletes, a reader that finds pointers missing.
    Pipelined per node; connection errors (a failover) refresh the slot map and try again.

    Raises
    ------
    RuntimeError
        Some pointer could not be set after ``attempts`` tries (the flip itself stands; lookups
        of those buckets answer from the version their pointer names until the next sync).
    """
    import redis as redis_mod

    from pipeline.serving.redis_client import is_cluster

    if value is None:
        value = current_raw(client, keys)
        if value is None:
            return 0
    value = value.encode() if isinstance(value, str) else value
    version, _, epoch = parse_pointer(value, keys.current)
    last: Exception | None = None
    for attempt in range(attempts):
        batch = NodeBatch(client)
        for ptr in keys.pointers:
            batch.add(ptr, "EVAL", SET_POINTER, 1, ptr, value, epoch)
        try:
            replies = batch.execute()
        except (redis_mod.ConnectionError, redis_mod.TimeoutError, OSError) as err:
            last = err
        else:
            errors = [r for r in replies if isinstance(r, Exception)]
            if not errors:
                return sum(r == 1 for r in replies)
            last = errors[0]
            if not isinstance(last, (redis_mod.exceptions.AskError,
                                     redis_mod.exceptions.TryAgainError,
                                     redis_mod.exceptions.ClusterDownError)):
                break
        if is_cluster(client):
            client.nodes_manager.initialize()
        time.sleep(0.1 * 2 ** attempt)
    raise RuntimeError(f"model {keys.model!r}: version {version} is current, but bucket "
                       f"pointers could not all be moved to it ({type(last).__name__}: {last}); "
                       "lookups of those buckets answer from the version their pointer names "
                       "until the next publish, rollback or prune moves them")


def flip(client, keys: ModelKeys, version: int, publish_id: str,
         fence: int | None = None) -> bytes:
    """Point ``current`` at a completely written version and append it to the version list;
    returns the new value of ``current`` (the caller then runs :func:`sync_pointers`);
    :class:`SupersededError` if a newer version was flipped meanwhile, :class:`FencedError`
    if ``fence`` (a lease token) no longer holds the model's lease."""
    import redis

    vk = keys.version(version)
    try:
        return run_script(client, FLIP, [keys.current, keys.versions, keys.pending, vk.meta,
                                         keys.epoch, keys.lease],
                          [version, publish_id, "" if fence is None else int(fence)])
    except redis.ResponseError as err:
        reason = lua_error(err)
        if reason.startswith("FENCED "):
            raise FencedError(f"model {keys.model!r}: {reason[len('FENCED '):]}") from None
        if reason.startswith("SUPERSEDED "):
            raise SupersededError(f"model {keys.model!r}: {reason[len('SUPERSEDED '):]}") \
                from None
        raise RuntimeError(f"cannot flip {keys.current} to version {version}: {reason}") from None


def rollback(model: str, redis, version: int | None = None, *,
             namespace: str = "rankstream") -> int:
    """Flip ``current`` back to ``version`` (default: the kept version published before the
    current one), then move the bucket pointers after it. Returns the version now current.

    Examples
    --------
    >>> rollback("movies", r)  # doctest: +SKIP
    6
    >>> rollback("movies", r, version=7)  # roll forward again  # doctest: +SKIP
    7
    """
    import redis as redis_mod

    keys = ModelKeys(namespace, model)
    for _ in range(10):
        raw = redis.get(keys.current)
        current = None if raw is None else parse_current(raw, keys.current)
        kept = kept_versions(redis, keys)
        if current is None:
            raise UnknownModelError(f"model {model!r} has no published version in namespace "
                                    f"{namespace!r}; nothing to roll back")
        target = version
        if target is None:
            older = [v for v in kept if v < current[0]]
            if not older:
                raise ValueError(f"model {model!r}: no kept version older than the current "
                                 f"version {current[0]} (kept: {kept})")
            target = older[-1]
        elif target not in kept:
            raise ValueError(f"model {model!r}: version {target} is not kept (kept: {kept})")
        try:
            value = run_script(redis, ROLLBACK, [keys.current, keys.versions,
                                                 keys.version(target).meta, keys.epoch],
                               [raw, target, FORMAT_VERSION])
        except redis_mod.ResponseError as err:
            if "CHANGED" not in str(err):
                raise ValueError(f"model {model!r}: cannot roll back to version {target}: "
                                 f"{lua_error(err)}") from None
            continue
        sync_pointers(redis, keys, value)
        return int(target)
    raise RuntimeError(f"model {model!r}: current kept changing during rollback; try again")


def prune(model: str, redis, keep_versions: int = 3, *, namespace: str = "rankstream",
          stale_after: float = 3600.0) -> list[int]:
    """Delete kept versions beyond the newest ``keep_versions`` (never the current one), and
    leftovers of publishes or prunes that died half-way (pending for over ``stale_after`` s).
    Returns the versions deleted. First it moves every bucket pointer to ``current``
    (:func:`sync_pointers`; this also repairs a publish or rollback that died between its flip
    and the pointers): a version is deleted only once no pointer names it.

    Examples
    --------
    >>> prune("movies", r, keep_versions=2)  # doctest: +SKIP
    [5]
    """
    return prune_versions(ModelKeys(namespace, model), redis, keep_versions, stale_after, sync=True)


def prune_versions(keys: ModelKeys, redis, keep_versions: int, stale_after: float = 3600.0,
                   sync: bool = True) -> list[int]:
    """:func:`prune`; ``sync=False`` (the caller just moved the pointers) moves them again
    only when something is to be deleted."""
    if keep_versions < 1:
        raise ValueError(f"keep_versions is {keep_versions}, it must be at least 1")
    kept = kept_versions(redis, keys)
    victims = kept[:-keep_versions]
    removed = []
    if victims:
        raw = run_script(redis, DROP, [keys.current, keys.versions, keys.pending], victims)
        removed = [int(v) for v in raw]
    current = read_current(redis, keys)
    kept = set(kept_versions(redis, keys))
    leftovers = []
    for raw in redis.smembers(keys.pending):
        v = int(raw)
        if v in removed:
            continue
        if v in kept or (current and current[0] == v):
            redis.srem(keys.pending, v)  # flipped meanwhile
            continue
        meta = {k.decode(): val.decode() for k, val in
                redis.hgetall(keys.version(v).meta).items()}
        stale = time.time() - _started(meta) > stale_after
        if meta.get("status") == "deleting" or stale:
            leftovers.append(v)
    deleted = removed + leftovers
    if deleted or sync:
        # Every pointer past the epoch of the drop first: then none names a dropped version,
        # and none ever will (pointers only move forward, to versions in `versions`).
        sync_pointers(redis, keys)
    for v in deleted:
        delete_version(redis, keys, v)
    live = kept | ({current[0]} if current else set())
    gone = [f for f in redis.hkeys(keys.lookups)
            if int(f.split(b":", 1)[0] or 0) not in live]
    if gone:
        redis.hdel(keys.lookups, *gone)
    return deleted


def _started(meta: dict) -> float:
    """Unix time publishing of a version started (0 when unknown: treat as stale)."""
    try:
        return datetime.fromisoformat(meta["published_at"]).timestamp()
    except (KeyError, ValueError):
        return 0.0
