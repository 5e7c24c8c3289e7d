-- Gather everything finalisation needs for one shard's due requests in one round trip.
-- KEYS[1] = <tag>dl   ARGV[1] = key prefix with tag   ARGV[2] = history epoch s
-- ARGV[3..] = request ids
-- Returns {requests, users}:
--   requests: {request_id, stored value, {event_id, pending value, ...}} for open ones
--   users:    {user_id, {loose member, ts, ...}, {history event, ts, ...},
--              {open request id, ts, ...}, {request id, stored value, ...}}
-- History comes from the epochs of the requests' times and the epochs before them.
-- The user's open impressions (for the user-based join) are only read when the
-- user has request-less interactions. Deadline entries of vanished requests are dropped.
local p = ARGV[1]
local epoch_ms = tonumber(ARGV[2]) * 1000
local requests, wanted, order, seen = {}, {}, {}, {}
local epochs, epoch_list = {}, {}
for i = 3, #ARGV do wanted[ARGV[i]] = true end
for i = 3, #ARGV do
  local rid = ARGV[i]
  local value = redis.call('GET', p .. 'r:' .. rid)
  if value then
    requests[#requests + 1] = {rid, value, redis.call('HGETALL', p .. 'ri:' .. rid)}
    local sep = string.find(value, '\30', 1, true)
    local uid = string.sub(value, 1, sep - 1)
    if not seen[uid] then
      seen[uid] = true
      order[#order + 1] = uid
    end
    local sep2 = string.find(value, '\30', sep + 1, true)
    local ts = tonumber(string.sub(value, sep2 + 1, string.find(value, '\30', sep2 + 1, true) - 1))
    local epoch = math.floor(ts / epoch_ms)
    for e = epoch - 1, epoch do
      if not epochs[e] then
        epochs[e] = true
        epoch_list[#epoch_list + 1] = e
      end
    end
  else
    redis.call('ZREM', KEYS[1], rid)
  end
end
if #order == 0 then return {requests, {}} end
-- a multi-key-field command per 4000 users (Lua's unpack limit)
local function each_user(command, key)
  local out = {}
  for i = 1, #order, 4000 do
    local got = redis.call(command, key, unpack(order, i, math.min(i + 3999, #order)))
    for j = 1, #got do out[i + j - 1] = got[j] end
  end
  return out
end
local hist = {}
for _, e in ipairs(epoch_list) do
  local got = each_user('HMGET', p .. 'h:' .. e)
  for j, v in ipairs(got) do
    if v then
      local flat = hist[j] or {}
      for eid, ts in string.gmatch(v, '([^\30\31]*)\31([^\30]*)') do
        flat[#flat + 1] = eid
        flat[#flat + 1] = ts
      end
      hist[j] = flat
    end
  end
end
local has_loose = each_user('ZMSCORE', p .. 'lu')
local users = {}
for j, uid in ipairs(order) do
  local loose, imps, others = {}, {}, {}
  if has_loose[j] then
    loose = redis.call('ZRANGE', p .. 'ul:' .. uid, 0, -1, 'WITHSCORES')
    if #loose == 0 then redis.call('ZREM', p .. 'lu', uid) end
  end
  if #loose > 0 then
    local entries, listed = {}, {}
    local open = redis.call('HGET', p .. 'uo', uid)
    if open then
      for rid, ts in string.gmatch(open, '([^\30\31]*)\31([^\30]*)') do
        if not listed[rid] then
          listed[rid] = true
          entries[#entries + 1] = {tonumber(ts), rid}
        end
      end
    end
    table.sort(entries, function(a, b)  -- sorted set order: time, then id
      if a[1] ~= b[1] then return a[1] < b[1] end
      return a[2] < b[2]
    end)
    for _, e in ipairs(entries) do
      imps[#imps + 1] = e[2]
      imps[#imps + 1] = string.format('%d', e[1])
      if not wanted[e[2]] then
        local other = redis.call('GET', p .. 'r:' .. e[2])
        if other then
          others[#others + 1] = e[2]
          others[#others + 1] = other
        end
      end
    end
  end
  users[#users + 1] = {uid, loose, hist[j] or {}, imps, others}
end
return {requests, users}
