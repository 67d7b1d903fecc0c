"""Published versions of a model in Redis: list them, flip ``current`` (publish and rollback),
prune old ones. Every state change is one Lua script over keys that share the model's hash tag,
so it is atomic (and valid in Redis Cluster); data keys are only deleted after their version
left the version list, so no reader can be pointed at a half-deleted version.

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

import json
import time
from dataclasses import dataclass, field
from datetime import datetime

from pipeline.serving.layout import (
    FORMAT_VERSION,
    LayoutError,
    ModelKeys,
    UnknownModelError,
    parse_current,
    unpack_keys,
)

# KEYS: current, versions, pending, meta;  ARGV: version, publish_id. Refuses to go backwards:
# a version older than the newest flipped one (a concurrent publisher started later and
# finished first) never becomes current, so `versions` stays in ascending order.
FLIP = """
local newest = redis.call('LINDEX', KEYS[2], -1)
if newest and tonumber(newest) > tonumber(ARGV[1]) then
  return redis.error_reply('rankstream: SUPERSEDED version ' .. newest .. ' was published ' ..
    'after version ' .. ARGV[1] .. ' started; not flipping back to the older one')
end
local status = redis.call('HGET', KEYS[4], 'status')
if status ~= 'complete' then
  return redis.error_reply('rankstream: version ' .. ARGV[1] .. ' is not complete (status ' ..
    tostring(status) .. ')')
end
if redis.call('HGET', KEYS[4], 'publish_id') ~= ARGV[2] then
  return redis.error_reply('rankstream: version ' .. ARGV[1] .. ' belongs to another publish')
end
redis.call('SET', KEYS[1], ARGV[1] .. ':' .. ARGV[2])
redis.call('RPUSH', KEYS[2], ARGV[1])
redis.call('SREM', KEYS[3], ARGV[1])
return 1
"""

# KEYS: current, versions, target meta;  ARGV: expected current value, target version
ROLLBACK = """
local cur = redis.call('GET', KEYS[1]) or ''
if cur ~= ARGV[1] then
  return redis.error_reply('rankstream: CHANGED current moved while rolling back')
end
if not redis.call('LPOS', KEYS[2], ARGV[2]) then
  return redis.error_reply('rankstream: version ' .. ARGV[2] .. ' is not a kept version')
end
if redis.call('HGET', KEYS[3], 'status') ~= 'complete' then
  return redis.error_reply('rankstream: version ' .. ARGV[2] .. ' is not complete')
end
local value = ARGV[2] .. ':' .. redis.call('HGET', KEYS[3], 'publish_id')
redis.call('SET', KEYS[1], value)
return value
"""

# KEYS: current, versions, pending;  ARGV: candidate versions to drop. Never drops current.
DROP = """
local cur = redis.call('GET', KEYS[1]) or ''
local curv = string.match(cur, '^(%d+):') or ''
local removed = {}
for _, v in ipairs(ARGV) do
  if v ~= curv and redis.call('LREM', KEYS[2], 0, v) > 0 then
    redis.call('SADD', KEYS[3], v)
    removed[#removed + 1] = v
  end
end
return removed
"""


class SupersededError(RuntimeError):
    """A newer version of the model went live while this one was being written."""


@dataclass
class VersionInfo:
    """One published version as listed by :func:`versions`."""

    version: int
    current: bool
    status: str
    kind: str = ""
    algorithm: str = ""
    publish_id: str = ""
    trained_at: str = ""
    published_at: str = ""
    n_items: int = 0
    n_lists: int = 0
    metrics: dict = field(default_factory=dict)


def _script(client, source: str):
    return client.register_script(source)


def _lua_error(err: Exception) -> str:
    return str(err).split("rankstream: ", 1)[-1].split(" script:", 1)[0]


def read_current(client, keys: ModelKeys) -> tuple[int, str] | None:
    """(version, publish_id) that ``current`` points to, or ``None`` if nothing is published."""
    import redis

    try:
        raw = client.get(keys.current)
    except redis.ResponseError as err:
        raise LayoutError(f"{keys.current} is not a string key ({err})") from None
    return None if raw is None else parse_current(raw, keys.current)


def _kept(client, keys: ModelKeys) -> list[int]:
    import redis

    try:
        raw = client.lrange(keys.versions, 0, -1)
    except redis.ResponseError as err:
        raise LayoutError(f"{keys.versions} is not a list ({err})") from None
    try:
        return [int(v) for v in raw]
    except ValueError:
        raise LayoutError(f"{keys.versions} holds {raw[:5]!r}..., expected version "
                          "numbers") from None


def versions(model: str, redis, *, namespace: str = "rankstream") -> list[VersionInfo]:
    """Kept versions of ``model``, oldest first, with their meta and which one is current.

    Examples
    --------
    >>> [(v.version, v.current) for v in versions("movies", r)]  # doctest: +SKIP
    [(6, False), (7, True)]
    """
    keys = ModelKeys(namespace, model)
    current = read_current(redis, keys)
    kept = _kept(redis, keys)
    if current is None and not kept:
        raise UnknownModelError(f"model {model!r} has no published version in namespace "
                                f"{namespace!r} ({keys.current} does not exist)")
    pipe = redis.pipeline(transaction=False)
    for v in kept:
        pipe.hgetall(keys.version(v).meta)
    out = []
    for v, meta in zip(kept, pipe.execute(raise_on_error=False)):
        if isinstance(meta, Exception):
            raise LayoutError(f"{keys.version(v).meta} is not a hash ({meta})")
        m = {k.decode(): val.decode() for k, val in meta.items()}
        try:
            metrics = json.loads(m.get("metrics", "{}"))
            info = VersionInfo(
                version=v, current=current is not None and current[0] == v,
                status=m.get("status", "missing"), kind=m.get("kind", ""),
                algorithm=m.get("algorithm", ""), publish_id=m.get("publish_id", ""),
                trained_at=m.get("trained_at", ""), published_at=m.get("published_at", ""),
                n_items=int(m.get("n_items", 0)), n_lists=int(m.get("n_lists", 0)),
                metrics=metrics)
        except ValueError as err:
            raise LayoutError(f"{keys.version(v).meta} has a malformed field: {err}") from None
        out.append(info)
    return out


def flip(client, keys: ModelKeys, version: int, publish_id: str) -> None:
    """Point ``current`` at a completely written version and append it to the version list;
    :class:`SupersededError` if a newer version was flipped meanwhile."""
    import redis

    vk = keys.version(version)
    try:
        _script(client, FLIP)(keys=[keys.current, keys.versions, keys.pending, vk.meta],
                              args=[version, publish_id], client=client)
    except redis.ResponseError as err:
        reason = _lua_error(err)
        if reason.startswith("SUPERSEDED "):
            raise SupersededError(f"model {keys.model!r}: {reason[len('SUPERSEDED '):]}") \
                from None
        raise RuntimeError(f"cannot flip {keys.current} to version {version}: {reason}") from None


def rollback(model: str, redis, version: int | None = None, *,
             namespace: str = "rankstream") -> int:
    """Flip ``current`` back to ``version`` (default: the kept version published before the
    current one). Returns the version now current.

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
        kept = _kept(redis, keys)
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
            _script(redis, ROLLBACK)(keys=[keys.current, keys.versions,
                                           keys.version(target).meta],
                                     args=[raw, target], client=redis)
            return int(target)
        except redis_mod.ResponseError as err:
            if "CHANGED" not in str(err):
                raise ValueError(f"model {model!r}: cannot roll back to version {target}: "
                                 f"{_lua_error(err)}") from None
    raise RuntimeError(f"model {model!r}: current kept changing during rollback; try again")


def prune(model: str, redis, keep_versions: int = 3, *, namespace: str = "rankstream",
          stale_after: float = 3600.0) -> list[int]:
    """Delete kept versions beyond the newest ``keep_versions`` (never the current one), and
    leftovers of publishes or prunes that died half-way (pending for over ``stale_after`` s).
    Returns the versions deleted.

    Examples
    --------
    >>> prune("movies", r, keep_versions=2)  # doctest: +SKIP
    [5]
    """
    if keep_versions < 1:
        raise ValueError(f"keep_versions is {keep_versions}, it must be at least 1")
    keys = ModelKeys(namespace, model)
    kept = _kept(redis, keys)
    victims = kept[:-keep_versions]
    removed = []
    if victims:
        raw = _script(redis, DROP)(keys=[keys.current, keys.versions, keys.pending],
                                   args=victims, client=redis)
        removed = [int(v) for v in raw]
    deleted = []
    for v in removed:
        delete_version(redis, keys, v)
        deleted.append(v)
    current = read_current(redis, keys)
    kept = set(_kept(redis, keys))
    for raw in redis.smembers(keys.pending):
        v = int(raw)
        if v in kept or (current and current[0] == v):
            redis.srem(keys.pending, v)  # flipped meanwhile
            continue
        meta = {k.decode(): val.decode() for k, val in
                redis.hgetall(keys.version(v).meta).items()}
        stale = time.time() - _started(meta) > stale_after
        if meta.get("status") == "deleting" or stale:
            delete_version(redis, keys, v)
            deleted.append(v)
    live = kept | ({current[0]} if current else set())
    gone = [f for f in redis.hkeys(keys.lookups)
            if int(f.split(b":", 1)[0] or 0) not in live]
    if gone:
        redis.hdel(keys.lookups, *gone)
    return deleted


def answer_counts(model: str, redis, *, namespace: str = "rankstream") -> dict:
    """{version: {source: answers}} that lookup clients reported for ``model``."""
    out: dict = {}
    for name, n in redis.hgetall(ModelKeys(namespace, model).lookups).items():
        version, _, source = name.decode().partition(":")
        out.setdefault(int(version), {})[source] = int(n)
    return out


def _started(meta: dict) -> float:
    """Unix time publishing of a version started (0 when unknown: treat as stale)."""
    try:
        return datetime.fromisoformat(meta["published_at"]).timestamp()
    except (KeyError, ValueError):
        return 0.0


def delete_version(client, keys: ModelKeys, version: int, batch: int = 1000) -> None:
    """Delete every key of ``version`` (which must no longer be listed or current) with UNLINK
    in batches, found through the version's key index (or a SCAN of its prefix when the index
    is incomplete); its meta hash goes last, then it leaves the pending set."""
    vk = keys.version(version)
    client.sadd(keys.pending, version)
    meta = {k.decode(): v.decode() for k, v in client.hgetall(vk.meta).items()}
    if meta:
        client.hset(vk.meta, "status", "deleting")
    names: list[str] = []
    try:
        if int(meta.get("format_version", -1)) != FORMAT_VERSION:
            raise LayoutError("unknown format")
        n_item_chunks = int(meta["n_item_chunks"])
        n_key_chunks = int(meta["n_key_chunks"])
        for c in range(n_item_chunks):
            names += [vk.items(c), vk.item_factors(c), vk.item_bias(c), vk.item_values(c)]
        names += [vk.global_list, vk.scorer]
        for c in range(n_key_chunks):
            raw = client.get(vk.key_index(c))
            if raw is None:
                raise LayoutError("key index chunk missing")
            for key in unpack_keys(raw, vk.key_index(c)):
                names += [vk.topk(key), vk.user_factor(key), vk.seen(key)]
            names.append(vk.key_index(c))
    except (KeyError, ValueError, LayoutError):
        names = [k.decode() for k in client.scan_iter(match=vk.prefix + "*", count=1000)]
        names = [n for n in names if n != vk.meta]
    pipe = client.pipeline(transaction=False)
    for i in range(0, len(names), batch):
        pipe.unlink(*names[i:i + batch])
        if (i // batch) % 20 == 19:
            pipe.execute()
    pipe.unlink(vk.meta)
    pipe.srem(keys.pending, version)
    pipe.execute()
