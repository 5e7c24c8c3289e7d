-- Claim finalised requests of one shard and add their statistics, atomically.
-- KEYS[1] = <tag>dl   ARGV[1] = key prefix with tag
-- ARGV[2] = msgpack {{request_id, user_id, variant, named interactions loaded, time,
--           deadline}, ...}, {{block suffix, bucket start, ttl s, window ms}, ...},
--           {day, {propensity field, increment, ...}, ...}}  (the estimators' counters,
--           <tag>ps:<day>, days listed in <tag>psd)
-- ARGV[3] = state ttl s   ARGV[4] = finalised-marker ttl s
-- ARGV[5] = doubles per block
-- ARGV[6] = prune request-less interactions older than this (ms)
-- ARGV[7] = the blocks' increments: little-endian doubles, one block after another,
--           pre-aggregated over exactly the listed requests.
-- ARGV[8] = propensity history ms (days older than the newest minus this are dropped)
-- ARGV[9] = pending-interaction epoch ms   ARGV[10] = finalised-marker period ms
-- Returns {requests claimed, {}, interactions counted late}. If any listed request
-- is already claimed (another instance, or a retry) or no longer open, nothing is
-- written and {0, those request ids, 0} is returned, so the caller can re-aggregate
-- without them: increments always match the claims.
local p = ARGV[1]
local data = cmsgpack.unpack(ARGV[2])
local ftl, nblock = tonumber(ARGV[4]), tonumber(ARGV[5])
local prune = '(' .. ARGV[6]
local pending_ms = tonumber(ARGV[9])
local PERIOD = tonumber(ARGV[10])
-- A request is open exactly while it is in the deadline index: finalisation removes it
-- in the same script that writes its fin:<period> marker, and ingest never re-opens a
-- request with a marker.
local rids = {}
for i, r in ipairs(data[1]) do rids[i] = r[1] end
local open = read('ZMSCORE', KEYS[1], rids)
local taken = {}
for i, rid in ipairs(rids) do
  if not open[i] then taken[#taken + 1] = rid end
end
if #taken > 0 then return {0, taken, 0} end

-- the interactions naming each request (from the epochs either side of its time)
local times = {}
for i, r in ipairs(data[1]) do times[i] = r[5] end
local applied = {}
for _, key in ipairs(epochs_around(times, pending_ms, 1, 1, p .. 'n:')) do
  local got = read('HMGET', key, rids)
  local present = {}
  for j = 1, #rids do
    if got[j] then
      applied[j] = applied[j] or {}
      for eid in string.gmatch(got[j], '([^\30\31]*)\31[^\30]*') do
        table.insert(applied[j], eid)
      end
      present[#present + 1] = rids[j]
    end
  end
  chunked('HDEL', key, present)
end
-- finalised markers: request -> ids of the interactions applied, so a redelivery is a
-- duplicate; interactions stored after the request was loaded (ingest runs beside
-- finalisation) were not applied: they are late, and listed too
local markers, late = {}, 0
local users, user_order, variants = {}, {}, {}
for j, r in ipairs(data[1]) do
  local ids = applied[j] or {}
  if #ids > r[4] then late = late + #ids - r[4] end
  local period = string.format('%d', r[6] - r[6] % PERIOD)
  if not markers[period] then markers[period] = {} end
  table.insert(markers[period], r[1])
  table.insert(markers[period], table.concat(ids, '\30'))
  local uid = r[2]
  if not users[uid] then
    users[uid] = {}
    user_order[#user_order + 1] = uid
  end
  users[uid][r[1]] = true
  variants[r[3]] = true
end
local periods = p .. 'fdays'
for period, flat in pairs(markers) do
  hset_expire(p .. 'fin:' .. period, flat, ftl)
  redis.call('ZADD', periods, period, period)
end
-- periods whose markers have all expired are forgotten
local newest = tonumber(redis.call('ZRANGE', periods, -1, -1, 'WITHSCORES')[2])
local oldest = newest - ftl * 1000 - 2 * PERIOD
redis.call('ZREMRANGEBYSCORE', periods, '-inf', '(' .. string.format('%d', oldest))
redis.call('EXPIRE', periods, ftl + 86400)
chunked('HDEL', p .. 'o', rids)
chunked('ZREM', KEYS[1], rids)
-- the users' open-request lists (uo: rid US ts RS ...) lose the finalised requests, and
-- entries of requests long past the horizon (expired without being finalised)
local stale_before = tonumber(ARGV[6]) - 2 * tonumber(ARGV[3]) * 1000
local lists, rewritten, emptied = read('HMGET', p .. 'uo', user_order), {}, {}
for i, uid in ipairs(user_order) do
  if lists[i] then
    local kept, done = {}, users[uid]
    for rid, ts in string.gmatch(lists[i], '([^\30\31]*)\31([^\30]*)') do
      if not done[rid] and tonumber(ts) >= stale_before then kept[#kept + 1] = rid .. '\31' .. ts end
    end
    if #kept > 0 then
      rewritten[#rewritten + 1] = uid
      rewritten[#rewritten + 1] = table.concat(kept, '\30')
    else
      emptied[#emptied + 1] = uid
    end
  end
end
chunked('HSET', p .. 'uo', rewritten)
chunked('HDEL', p .. 'uo', emptied)
-- pruned request-less interactions are remembered as seen (ux:), so a redelivery
-- after a crash counts as a duplicate, not as late; only users listed in lu: have any
local loose_ts = read('ZMSCORE', p .. 'lu', user_order)
for i, uid in ipairs(user_order) do
  if loose_ts[i] then
    local lk = p .. 'ul:' .. uid
    local old = redis.call('ZRANGEBYSCORE', lk, '-inf', prune)
    if #old > 0 then
      for j, member in ipairs(old) do old[j] = string.match(member, '^[^\031]*') end
      local xk = p .. 'ux:' .. uid
      redis.call('SADD', xk, unpack(old))
      redis.call('EXPIRE', xk, ftl)
      redis.call('ZREMRANGEBYSCORE', lk, '-inf', prune)
      if redis.call('EXISTS', lk) == 0 then redis.call('ZREM', p .. 'lu', uid) end
    end
  end
end
redis.call('ZREMRANGEBYSCORE', p .. 'lu', '-inf', '(' .. string.format('%d', stale_before))
for variant in pairs(variants) do redis.call('SADD', p .. 'vars', variant) end
local fmt = '<' .. string.rep('d', nblock)
local incs = ARGV[7]
local version = redis.call('INCR', p .. 'ver')
local oldest = {}
for i, b in ipairs(data[2]) do
  local bk = p .. 'b:' .. b[1]
  local at = (i - 1) * nblock * 8 + 1
  local cur = redis.call('GET', bk)
  if cur then
    local inc, vals = {struct.unpack(fmt, incs, at)}, {struct.unpack(fmt, cur)}
    for j = 1, nblock do inc[j] = inc[j] + vals[j] end
    redis.call('SET', bk, struct.pack(fmt, unpack(inc, 1, nblock)), 'EX', b[3])
  else  -- a new block is its increments, bytes as they are (no unpacking and packing)
    redis.call('SET', bk, string.sub(incs, at, at + nblock * 8 - 1), 'EX', b[3])
  end
  redis.call('ZADD', p .. 'bi:' .. b[4], b[2], b[1])
  redis.call('ZADD', p .. 'mod:' .. b[4], version, b[1])
  local cutoff = b[2] - 2 * b[4]
  if not oldest[b[4]] or cutoff < oldest[b[4]] then oldest[b[4]] = cutoff end
end
-- forget blocks that fell far out of their window (their keys expire by TTL)
for window, cutoff in pairs(oldest) do
  local index = p .. 'bi:' .. window
  local gone = redis.call('ZRANGEBYSCORE', index, '-inf', '(' .. cutoff, 'LIMIT', 0, 1000)
  if #gone > 0 then
    redis.call('ZREM', p .. 'mod:' .. window, unpack(gone))
    redis.call('ZREM', index, unpack(gone))
  end
end
local ps = data[3] or {}
if #ps > 0 then
  local history = tonumber(ARGV[8])
  local days = p .. 'psd'
  for i = 1, #ps, 2 do
    local key, incs = p .. 'ps:' .. ps[i], ps[i + 1]
    for j = 1, #incs, 2 do redis.call('HINCRBY', key, incs[j], incs[j + 1]) end
    redis.call('EXPIRE', key, math.floor(history / 1000) + 86400)
    redis.call('ZADD', days, tonumber(ps[i]), ps[i])
  end
  -- forget days that fell out of the history (their hashes expire by TTL as well)
  local newest = tonumber(redis.call('ZRANGE', days, -1, -1, 'WITHSCORES')[2])
  local first_day = newest - math.floor((history - 1) / 86400000) * 86400000
  local gone = redis.call('ZRANGEBYSCORE', days, '-inf', '(' .. first_day)
  for _, day in ipairs(gone) do redis.call('DEL', p .. 'ps:' .. day) end
  redis.call('ZREMRANGEBYSCORE', days, '-inf', '(' .. first_day)
  redis.call('EXPIRE', days, math.floor(history / 1000) + 86400)
end
redis.call('HINCRBY', p .. 'c', 'finalised', #data[1])
if late > 0 then redis.call('HINCRBY', p .. 'c', 'late', late) end
return {#data[1], {}, late}
