"""Published versions of a model in Redis: list them, flip ``current`` (publish and rollback),
move the bucket pointers after it, prune old ones. Every change of ``current`` is one Lua
script over keys that share the model's hash tag, so it is atomic (and valid in Redis Cluster);
each bucket pointer then follows with a compare-on-epoch script in its own slot. Data keys are
only deleted after their version left the version list *and* every bucket pointer has moved
past it, so no reader can be pointed at a half-deleted version (``REDIS_LAYOUT.md`` has the
argument).

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
import re
import time
from dataclasses import dataclass, field
from datetime import datetime, timezone

from pipeline.serving.layout import (
    BUCKETS,
    FORMAT_VERSION,
    LayoutError,
    ModelKeys,
    UnknownModelError,
    parse_current,
    parse_pointer,
    unpack_keys,
)
from pipeline.serving.shards import NodeBatch

# KEYS: current, versions, pending, meta, epoch, lease;  ARGV: version, publish_id, fencing
# token ('' for a publish that holds no lease). Refuses to go backwards: a version older than
# the newest flipped one (a concurrent publisher started later and finished first) never
# becomes current, so `versions` stays in ascending order. With a token, refuses unless the
# model's lease still holds that token: a retrain whose lease expired or was revoked (a paused
# process, a partitioned host) never flips over the run that took the lease after it. Returns
# the new value of `current`, "<version>:<publish_id>:<epoch>".
FLIP = """
if ARGV[3] ~= '' then
  local held = redis.call('GET', KEYS[6])
  if not held or string.match(held, '^(%d+) ') ~= ARGV[3] then
    return redis.error_reply('rankstream: FENCED the retrain lease (token ' .. ARGV[3] ..
      ') is no longer held: ' .. (held and ('token ' .. held .. ' holds it') or
      'it expired or was revoked') .. '; not flipping')
  end
end
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
local value = ARGV[1] .. ':' .. ARGV[2] .. ':' .. redis.call('INCR', KEYS[5])
redis.call('SET', KEYS[1], value)
redis.call('RPUSH', KEYS[2], ARGV[1])
redis.call('SREM', KEYS[3], ARGV[1])
return value
"""

# KEYS: current, versions, target meta, epoch;  ARGV: expected current value, target version,
# format version. Returns the new value of `current`.
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
local fmt = redis.call('HGET', KEYS[3], 'format_version')
if fmt ~= ARGV[3] then
  return redis.error_reply('rankstream: version ' .. ARGV[2] .. ' has format_version ' ..
    tostring(fmt) .. ', this rankstream serves format ' .. ARGV[3])
end
local value = ARGV[2] .. ':' .. redis.call('HGET', KEYS[3], 'publish_id') .. ':' ..
  redis.call('INCR', KEYS[4])
redis.call('SET', KEYS[1], value)
return value
"""

# KEYS: one bucket pointer;  ARGV: the value of `current` to copy, its epoch. Moves the pointer
# only forward in epochs, so a delayed copy (a publisher or rollback that stalled after its
# flip) can never move a pointer back to a version that was pruned meanwhile.
SET_POINTER = """
local cur = redis.call('GET', KEYS[1])
if cur then
  local e = tonumber(string.match(cur, '^%d+:%x+:(%d+)$'))
  if e and e >= tonumber(ARGV[2]) then return 0 end
end
redis.call('SET', KEYS[1], ARGV[1])
return 1
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


class FencedError(SupersededError):
    """The retrain's lease on the model was lost (expired or revoked) before its flip."""


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
    served_as: str = "model"


def _script(client, source: str, keys: list, args: list):
    """Run a Lua script with ``EVAL`` (routed by its keys' slot on a cluster; scripts are a
    few hundred bytes, sent with each call rather than kept by SHA on every node)."""
    return client.eval(source, len(keys), *keys, *args)


def _lua_error(err: Exception) -> str:
    return str(err).split("rankstream: ", 1)[-1].split(" script:", 1)[0]


def read_current(client, keys: ModelKeys) -> tuple[int, str] | None:
    """(version, publish_id) that ``current`` points to, or ``None`` if nothing is published."""
    raw = _current_raw(client, keys)
    return None if raw is None else parse_current(raw, keys.current)


def _current_raw(client, keys: ModelKeys) -> bytes | None:
    import redis

    try:
        return client.get(keys.current)
    except redis.ResponseError as err:
        raise LayoutError(f"{keys.current} is not a string key ({err})") from None


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
        value = _current_raw(client, keys)
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
                metrics=metrics, served_as=m.get("served_as", "model"))
        except ValueError as err:
            raise LayoutError(f"{keys.version(v).meta} has a malformed field: {err}") from None
        out.append(info)
    return out


def flip(client, keys: ModelKeys, version: int, publish_id: str,
         fence: int | None = None) -> bytes:
    """Point ``current`` at a completely written version and append it to the version list;
    returns the new value of ``current`` (the caller then runs :func:`sync_pointers`);
    :class:`SupersededError` if a newer version was flipped meanwhile, :class:`FencedError`
    if ``fence`` (a lease token) no longer holds the model's lease."""
    import redis

    vk = keys.version(version)
    try:
        return _script(client, FLIP, [keys.current, keys.versions, keys.pending, vk.meta,
                                      keys.epoch, keys.lease],
                       [version, publish_id, "" if fence is None else int(fence)])
    except redis.ResponseError as err:
        reason = _lua_error(err)
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
            value = _script(redis, ROLLBACK, [keys.current, keys.versions,
                                              keys.version(target).meta, keys.epoch],
                            [raw, target, FORMAT_VERSION])
        except redis_mod.ResponseError as err:
            if "CHANGED" not in str(err):
                raise ValueError(f"model {model!r}: cannot roll back to version {target}: "
                                 f"{_lua_error(err)}") from None
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
    kept = _kept(redis, keys)
    victims = kept[:-keep_versions]
    removed = []
    if victims:
        raw = _script(redis, DROP, [keys.current, keys.versions, keys.pending], victims)
        removed = [int(v) for v in raw]
    current = read_current(redis, keys)
    kept = set(_kept(redis, keys))
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


def served_versions(model: str, redis, *, namespace: str = "rankstream") -> list[VersionInfo]:
    """:func:`versions`, or ``[]`` for a model with nothing published."""
    try:
        return versions(model, redis, namespace=namespace)
    except UnknownModelError:
        return []


def current_version(model: str, redis, *, namespace: str = "rankstream") -> VersionInfo | None:
    """The version lookups are served from, or None."""
    return next((v for v in served_versions(model, redis, namespace=namespace) if v.current),
                None)


def age_seconds(iso: str) -> float | None:
    """Seconds since the ISO 8601 time ``iso`` (UTC when it names no zone); None when it is
    not one."""
    try:
        then = datetime.fromisoformat(iso)
    except (TypeError, ValueError):
        return None
    if then.tzinfo is None:
        then = then.replace(tzinfo=timezone.utc)
    return round(time.time() - then.timestamp(), 1)


def fallback_share(model: str, redis, version: int, *,
                   namespace: str = "rankstream") -> tuple[float | None, int]:
    """(share of ``version``'s lookups answered from the fallback list, lookups counted)."""
    counts = answer_counts(model, redis, namespace=namespace).get(version, {})
    total = sum(counts.values())
    return (counts.get("fallback", 0) / total if total else None), total


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


def delete_version(client, keys: ModelKeys, version: int, batch: int = 1000,
                   bucket_group: int = 64) -> None:
    """Delete every key of ``version`` (which must no longer be listed or current, and no
    bucket pointer may name it) with UNLINK in batches of ``batch`` keys of one slot, pipelined
    per node: model-level keys by name, per-key keys through each bucket's key index,
    ``bucket_group`` buckets at a time (or a SCAN of the version's prefixes when an index is
    incomplete). Its meta hash goes last, then it leaves the pending set."""
    vk = keys.version(version)
    client.sadd(keys.pending, version)
    meta = {k.decode(): v.decode() for k, v in client.hgetall(vk.meta).items()}
    if meta:
        client.hset(vk.meta, "status", "deleting")
    try:
        model_names, index = _indexed_names(client, vk, meta)
        per_bucket = None
    except (KeyError, ValueError, LayoutError):
        model_names, per_bucket = _scanned_names(client, keys, vk)
    unlink = _Unlinker(client, keys, batch)
    unlink.add(None, model_names)
    if per_bucket is not None:
        for b, names in per_bucket.items():
            unlink.add(b, names)
    else:
        buckets = [b for b, chunks in enumerate(index) if chunks]
        for g in range(0, len(buckets), bucket_group):
            group = buckets[g:g + bucket_group]
            reads = NodeBatch(client)
            where = []
            for b in group:
                for c in range(index[b]):
                    reads.add(keys.pointer(b), "GET", vk.key_index(b, c))
                    where.append((b, c))
            names: dict[int, list[str]] = {b: [] for b in group}
            for (b, c), raw in zip(where, reads.execute()):
                prefix = vk.bucket_prefixes[b]
                if isinstance(raw, bytes):
                    for key in unpack_keys(raw, vk.key_index(b, c)):
                        names[b] += [prefix + "topk:" + key, prefix + "u:" + key,
                                     prefix + "seen:" + key]
            for b in group:   # the index chunks after the keys they list
                unlink.add(b, names[b] + [vk.key_index(b, c) for c in range(index[b])])
            unlink.flush()
    unlink.add(None, [vk.meta])
    unlink.flush()
    client.srem(keys.pending, version)


def _indexed_names(client, vk, meta: dict) -> tuple[list[str], list[int]]:
    """Model-level key names of a version and its key index chunks per bucket; LayoutError
    when the meta or an index chunk is missing (the caller then scans)."""
    if int(meta.get("format_version", -1)) != FORMAT_VERSION:
        raise LayoutError("unknown format")
    names = [vk.global_list, vk.scorer]
    for c in range(int(meta["n_item_chunks"])):
        names += [vk.items(c), vk.item_factors(c), vk.item_bias(c), vk.item_values(c),
                  vk.global_scores(c)]
    counts = json.loads(meta["bucket_keys"])
    key_chunk = int(meta["key_chunk"])
    if len(counts) != BUCKETS or key_chunk < 1:
        raise LayoutError("bucket_keys does not list every bucket")
    index = [-(-int(n) // key_chunk) for n in counts]
    check = NodeBatch(client)
    base = vk.base
    for b, chunks in enumerate(index):
        for c in range(chunks):
            check.add("{" + base + ":" + str(b) + "}", "EXISTS", vk.key_index(b, c))
    if not all(r == 1 for r in check.execute()):
        raise LayoutError("key index incomplete")
    return names, index


_BUCKET_KEY = re.compile(r"^\{([^{}]*):([0-9]+)\}:v([0-9]+):")


def _scanned_names(client, keys: ModelKeys, vk) -> tuple[list[str], dict[int, list[str]]]:
    """Key names of a version found by SCAN (every node of a cluster): model-level ones, and
    per bucket."""
    model = [k.decode() for k in client.scan_iter(match=vk.prefix + "*", count=1000)]
    model = [n for n in model if n != vk.meta]
    per_bucket: dict[int, list[str]] = {}
    pattern = "{" + vk.base + ":*}:v" + str(vk.version) + ":*"
    for raw in client.scan_iter(match=pattern, count=1000):
        name = raw.decode()
        m = _BUCKET_KEY.match(name)
        if m and m.group(1) == vk.base and int(m.group(3)) == vk.version:
            per_bucket.setdefault(int(m.group(2)), []).append(name)
    return model, per_bucket


class _Unlinker:
    """UNLINK commands of at most ``batch`` keys of one slot, pipelined per node."""

    def __init__(self, client, keys: ModelKeys, batch: int):
        self.keys, self.size = keys, batch
        self.batch = NodeBatch(client)

    def add(self, bucket: int | None, names: list[str]) -> None:
        route = self.keys.current if bucket is None else self.keys.pointer(bucket)
        for i in range(0, len(names), self.size):
            self.batch.add(route, "UNLINK", *names[i:i + self.size])
        if len(self.batch) >= 200:
            self.flush()

    def flush(self) -> None:
        if len(self.batch):
            errors = [r for r in self.batch.execute() if isinstance(r, Exception)]
            if errors:
                raise RuntimeError(f"model {self.keys.model!r}: UNLINK refused: {errors[0]}")
