"""The Lua scripts that change a model's versions in Redis, each atomic because its keys share
one hash tag (one slot of a cluster): ``FLIP`` (publish), ``ROLLBACK``, ``SET_POINTER`` (one
bucket pointer follows ``current``) and ``DROP`` (versions leave the version list before their
keys are deleted). :mod:`pipeline.serving.versions` runs them; ``REDIS_LAYOUT.md`` has the
argument why no reader sees a half-written or half-deleted version.
"""

from __future__ import annotations

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


def run_script(client, source: str, keys: list, args: list):
    """Run a Lua script with ``EVAL`` (routed by its keys' slot on a cluster; scripts are a
    few hundred bytes, sent with each call rather than kept by SHA on every node)."""
    return client.eval(source, len(keys), *keys, *args)


def lua_error(err: Exception) -> str:
    return str(err).split("rankstream: ", 1)[-1].split(" script:", 1)[0]
