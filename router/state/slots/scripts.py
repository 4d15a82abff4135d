"""The Lua scripts of shared slots: each runs atomically in Redis, so a check and the charge it
allows are one step for every router process at once. Their arithmetic is that of
router/state/slots/arithmetic.py (`take`, `taken`, `release`), which tests hold them to.

Keys (under the profile's `state.key_prefix`): `slots:b:<origin>` and `slots:lane:<lane>` are
slot hashes (totals `f`, `p`, `l` and the same per holder, `f:<holder>`, …; a lane's hash also
holds each holder's part of the lane's limit, `x:<holder>`, so every process can tell how far
the others hold beyond their parts); `slots:keys` is the set of slot hashes in use,
`slots:holders` the set of holders, `slots:hb:<holder>` a holder's heartbeat, set with a lease
its process renews. A holder is `<run>/<n>`: the run names the process, `n` counts its
re-homings. `slots:epoch` says which Redis this is: a Redis that lost its data (restarted empty)
has none, and the first process to re-home there creates it, naming in `slots:expect` the runs
it saw alive before; no slot is granted until each of them has re-homed what it holds, or for
at most the lease. The scripts touch heartbeats and slot hashes they find in those sets, not
only their declared keys: they need one Redis, not a cluster."""

from __future__ import annotations

# Shared by every script: give a holder's counters back, and drop a holder whole.
_COMMON = """
local function num(v) return tonumber(v) or 0 end
local COUNTERS = {'f', 'p', 'l'}
-- Up to `amount` of `counter` that `holder` holds on `key`, given back. Returns what was given
-- and the total before.
local function give_back(key, counter, holder, amount)
  local field = counter .. ':' .. holder
  local held = num(redis.call('HGET', key, field))
  local given = math.min(held, amount)
  if given <= 0 then return 0, 0 end
  local total = num(redis.call('HGET', key, counter))
  if held == given then redis.call('HDEL', key, field) else redis.call('HINCRBY', key, field, -given) end
  redis.call('HSET', key, counter, math.max(0, total - given))
  return given, total
end
-- Everything `holder` holds, given back; the holder forgotten. True if it held anything.
local function drop(keys_set, holders_set, hb_prefix, holder)
  local any = false
  for _, key in ipairs(redis.call('SMEMBERS', keys_set)) do
    for _, counter in ipairs(COUNTERS) do
      if give_back(key, counter, holder, math.huge) > 0 then any = true end
    end
  end
  for _, key in ipairs(redis.call('SMEMBERS', keys_set)) do redis.call('HDEL', key, 'x:' .. holder) end
  redis.call('SREM', holders_set, holder)
  redis.call('DEL', hb_prefix .. holder)
  return any
end
-- What holders other than `holder` hold of `key`'s in-flight count beyond their parts.
local function excess(key, holder)
  local all = redis.call('HGETALL', key)
  local held, part = {}, {}
  for i = 1, #all, 2 do
    local head, who = string.sub(all[i], 1, 2), string.sub(all[i], 3)
    if head == 'f:' then held[who] = num(all[i + 1]) elseif head == 'x:' then part[who] = num(all[i + 1]) end
  end
  local over = 0
  for who, n in pairs(held) do
    if who ~= holder then over = over + math.max(0, n - (part[who] or 0)) end
  end
  return over
end
local function now_ms()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end
local function counts_of(out, key)
  local c = redis.call('HMGET', key, 'f', 'p', 'l')
  out[#out + 1] = num(c[1]); out[#out + 1] = num(c[2]); out[#out + 1] = num(c[3])
end
"""

# KEYS: [1] slots:keys, [2] this holder's heartbeat, [3] the lane's hash, [4..] candidate
# backends, in the order to try. ARGV: [1] holder, [2] take the lane 1|0, [3] lane limit (-1: none),
# [4] long 1|0, [5] max_prefilling (-1: none), [6] max_long_prefilling (-1: none), then, when
# given, [7] the epoch hash, [8] the set of runs expected, [9] this holder's part of the lane limit,
# [10] the channel on which a take beyond that part is told (`<holder> <lane hash>`).
# Returns {result, lane count, f, p, l of each candidate, the lane's excess}: result is the
# candidate taken (1-based), 0 no room, -1 lane full, -2 unknown holder, -3 Redis lost its data
# moments ago and waits for processes to re-home; counts are after the take; the excess is what
# other holders hold of the lane beyond their parts.
TAKE = (
    _COMMON
    + """
local holder = ARGV[1]
local take_lane = ARGV[2] == '1'
local lane_limit = tonumber(ARGV[3])
local long = ARGV[4] == '1'
local maxp = tonumber(ARGV[5])
local maxl = tonumber(ARGV[6])
local lane_count = num(redis.call('HGET', KEYS[3], 'f'))
local out = {0, lane_count}
local chosen = 0
for i = 4, #KEYS do
  counts_of(out, KEYS[i])
  local p, l = out[#out - 1], out[#out]
  if chosen == 0 and (maxp < 0 or (p < maxp and (not long or maxl < 0 or l < maxl))) then
    chosen = i - 3
  end
end
if take_lane and lane_limit >= 0 and lane_count >= lane_limit then chosen = -1 end
if ARGV[7] and redis.call('SCARD', ARGV[8]) > 0 then
  local settled = tonumber(redis.call('HGET', ARGV[7], 'until'))
  if settled and now_ms() < settled then chosen = -3 end
end
if redis.call('EXISTS', KEYS[2]) == 0 then chosen = -2 end
out[1] = chosen
if chosen <= 0 then
  out[#out + 1] = excess(KEYS[3], holder)
  return out
end
local function charge(key, counter)
  redis.call('HINCRBY', key, counter, 1)
  redis.call('HINCRBY', key, counter .. ':' .. holder, 1)
end
if take_lane then
  charge(KEYS[3], 'f')
  local part = tonumber(ARGV[9] or -1)
  if part >= 0 then
    redis.call('HSET', KEYS[3], 'x:' .. holder, part)
    -- One more beyond this holder's part: every other process hears it at once.
    if ARGV[10] and num(redis.call('HGET', KEYS[3], 'f:' .. holder)) > part then
      redis.call('PUBLISH', ARGV[10], holder .. ' ' .. KEYS[3])
    end
  end
  redis.call('SADD', KEYS[1], KEYS[3])
  out[2] = lane_count + 1
end
local key = KEYS[chosen + 3]
charge(key, 'f'); charge(key, 'p')
local at = 2 + (chosen - 1) * 3
out[at + 1] = out[at + 1] + 1
out[at + 2] = out[at + 2] + 1
if long then charge(key, 'l'); out[at + 3] = out[at + 3] + 1 end
redis.call('SADD', KEYS[1], key)
out[#out + 1] = excess(KEYS[3], holder)
return out
"""
)

# Releases, and the re-homing of a process's holdings under a new holder.
# KEYS: [1] slots:keys, [2] slots:holders, [3] this holder's heartbeat, [4..] slot hashes.
# ARGV: [1] holder, [2] lease ms, [3] heartbeat key prefix, [4] channel, [5] register 1|0,
# [6] n, [7..6+n] holders to drop first, then per change four values: the slot hash's position
# among KEYS[4..], counter, delta (> 0 charged unconditionally, < 0 given back), limit (-1: none).
# `register` (re)creates the holder and its heartbeat. Publishes on the channel when a give-back
# freed a full resource or a dropped holder held anything.
# Returns {1 if the holder is known, else 0; 1 if it published, else 0; then f, p, l of each
# slot hash}.
ADJUST = (
    _COMMON
    + """
local holder = ARGV[1]
local freed = false
local n = tonumber(ARGV[6])
for i = 7, 6 + n do
  if drop(KEYS[1], KEYS[2], ARGV[3], ARGV[i]) then freed = true end
end
if ARGV[5] == '1' then
  redis.call('SET', KEYS[3], '1', 'PX', ARGV[2])
  redis.call('SADD', KEYS[2], holder)
end
for i = 7 + n, #ARGV, 4 do
  local key = KEYS[tonumber(ARGV[i]) + 3]
  local counter = ARGV[i + 1]
  local delta = tonumber(ARGV[i + 2])
  local limit = tonumber(ARGV[i + 3])
  if delta > 0 then
    redis.call('HINCRBY', key, counter, delta)
    redis.call('HINCRBY', key, counter .. ':' .. holder, delta)
    redis.call('SADD', KEYS[1], key)
  else
    local given, total = give_back(key, counter, holder, -delta)
    if limit >= 0 and given > 0 and total >= limit and total - given < limit then freed = true end
  end
end
if freed then redis.call('PUBLISH', ARGV[4], '1') end
local out = {redis.call('EXISTS', KEYS[3]), freed and 1 or 0}
for i = 4, #KEYS do counts_of(out, KEYS[i]) end
return out
"""
)

# The heartbeat: renew this holder's lease (only while it is known: a holder found gone must
# re-home its holdings, router/state/slots/store.py), drop every holder whose lease ran out, and
# forget slot hashes nobody holds anything on. The runs a Redis that lost its data still awaits
# count as alive: should it lose its data again, the next epoch awaits them too.
# KEYS: [1] slots:keys, [2] slots:holders, [3] slots:epoch, [4] slots:expect. ARGV: [1] holder,
# [2] lease ms, [3] heartbeat key prefix, [4] channel, [5] the prefix of lane hashes. Returns
# {1 if the holder was known, else 0; holders dropped; n, then the n holders (or runs) alive;
# then each lane hash and its excess for this holder}.
BEAT = (
    _COMMON
    + """
local hb = ARGV[3] .. ARGV[1]
local known = redis.call('EXISTS', hb)
if known == 1 then redis.call('PEXPIRE', hb, ARGV[2]) end
local dropped, freed = 0, false
for _, holder in ipairs(redis.call('SMEMBERS', KEYS[2])) do
  if redis.call('EXISTS', ARGV[3] .. holder) == 0 then
    if drop(KEYS[1], KEYS[2], ARGV[3], holder) then freed = true end
    dropped = dropped + 1
  end
end
for _, key in ipairs(redis.call('SMEMBERS', KEYS[1])) do
  local c = redis.call('HMGET', key, 'f', 'p', 'l')
  if num(c[1]) + num(c[2]) + num(c[3]) == 0 then
    redis.call('DEL', key)
    redis.call('SREM', KEYS[1], key)
  end
end
if freed then redis.call('PUBLISH', ARGV[4], '1') end
local alive = redis.call('SMEMBERS', KEYS[2])
local settled = KEYS[3] and tonumber(redis.call('HGET', KEYS[3], 'until'))
if settled and now_ms() < settled then
  for _, run in ipairs(redis.call('SMEMBERS', KEYS[4])) do alive[#alive + 1] = run end
end
local out = {known, dropped, #alive}
for _, holder in ipairs(alive) do out[#out + 1] = holder end
local prefix = ARGV[5] or ''
for _, key in ipairs(redis.call('SMEMBERS', KEYS[1])) do
  if prefix ~= '' and string.sub(key, 1, #prefix) == prefix then
    out[#out + 1] = key
    out[#out + 1] = excess(key, ARGV[1])
  end
end
return out
"""
)

# A process's re-homing: drop the holders it used before, register its new holder and charge it
# with everything the process holds, in one step. A Redis without an epoch lost its data: the
# first process to re-home there creates one and names the runs it saw alive, and grants wait
# (`TAKE` answers -3) until each of those has re-homed too, or for at most `settle` ms.
# KEYS: [1] slots:keys, [2] slots:holders, [3] this holder's heartbeat, [4] slots:epoch,
# [5] slots:expect, [6..] slot hashes. ARGV: [1] holder, [2] lease ms, [3] heartbeat key prefix,
# [4] channel, [5] this run, [6] settle ms, [7] n, [8..7+n] holders to drop, then m and m runs
# seen alive, then per charge four values: the slot hash's position among KEYS[6..], counter,
# amount, this holder's part of the limit (-1: none, or not a lane).
# Returns {epoch, 1 if this call created it, 1 if this run was awaited, runs still awaited}.
REHOME = (
    _COMMON
    + """
local holder, run = ARGV[1], ARGV[5]
local freed = false
local n = tonumber(ARGV[7])
for i = 8, 7 + n do
  if drop(KEYS[1], KEYS[2], ARGV[3], ARGV[i]) then freed = true end
end
local now = now_ms()
local created = 0
local epoch = redis.call('HGET', KEYS[4], 'id')
if not epoch then
  epoch = run .. '@' .. now
  redis.call('HSET', KEYS[4], 'id', epoch, 'until', now + tonumber(ARGV[6]))
  redis.call('DEL', KEYS[5])
  created = 1
end
local m = tonumber(ARGV[8 + n])
local settling = now < num(redis.call('HGET', KEYS[4], 'until'))
if settling then
  local present = {}
  for _, h in ipairs(redis.call('SMEMBERS', KEYS[2])) do
    present[string.match(h, '^(.*)/[^/]*$') or h] = true
  end
  for i = 9 + n, 8 + n + m do
    if ARGV[i] ~= run and not present[ARGV[i]] then redis.call('SADD', KEYS[5], ARGV[i]) end
  end
end
local awaited = redis.call('SREM', KEYS[5], run)
redis.call('SET', KEYS[3], '1', 'PX', ARGV[2])
redis.call('SADD', KEYS[2], holder)
for i = 9 + n + m, #ARGV, 4 do
  local key = KEYS[tonumber(ARGV[i]) + 5]
  local counter = ARGV[i + 1]
  local amount = tonumber(ARGV[i + 2])
  redis.call('HINCRBY', key, counter, amount)
  redis.call('HINCRBY', key, counter .. ':' .. holder, amount)
  if tonumber(ARGV[i + 3]) >= 0 then redis.call('HSET', key, 'x:' .. holder, ARGV[i + 3]) end
  redis.call('SADD', KEYS[1], key)
end
if not settling then redis.call('DEL', KEYS[5]) end
if freed then redis.call('PUBLISH', ARGV[4], '1') end
return {epoch, created, awaited, redis.call('SCARD', KEYS[5])}
"""
)
