-- Ingest one shard's events idempotently. All keys share the shard's hash tag.
-- KEYS[1] = <tag>dl (deadline index; routing key)   ARGV[1] = key prefix with tag
-- ARGV[2] = msgpack {impressions, interactions}   ARGV[3] = state ttl s
-- ARGV[4] = history cap   ARGV[5] = history epoch s (also the history keys' ttl unit)
-- ARGV[6] = loose late-before ms
-- ARGV[7] = finalised-marker ttl s (ux: sets remember late request-less interactions)
-- impression:  {request_id, user_id, ts, deadline, stored value}
-- interaction: {event_id, user_id, request_id or "", ts, grade, pending value, loose member}
-- Per-user state that every event touches lives in per-shard hashes (uo, h:<epoch>)
-- and is written with one multi-field command per batch: a redis.call costs far
-- more than one more field.
local p = ARGV[1]
local data = cmsgpack.unpack(ARGV[2])
local ttl = tonumber(ARGV[3])
local cap = tonumber(ARGV[4])
local epoch_s = tonumber(ARGV[5])
local late_before = tonumber(ARGV[6])
local ftl = tonumber(ARGV[7])
local dup, late = 0, 0
local CHUNK = 4000  -- Lua's unpack takes at most ~8000 values
local function chunked(command, key, list)
  for i = 1, #list, CHUNK do
    redis.call(command, key, unpack(list, i, math.min(i + CHUNK - 1, #list)))
  end
end

-- Appends to per-user entries of a hash: {user -> {entry, ...}} is merged by `merge`
-- (old value or false, new entries) and written back in one HSET.
local function update_users(key, by_user, order, merge, seconds)
  if #order == 0 then return end
  local old = {}
  for i = 1, #order, CHUNK do
    local got = redis.call('HMGET', key, unpack(order, i, math.min(i + CHUNK - 1, #order)))
    for j, v in ipairs(got) do old[i + j - 1] = v end
  end
  local out = {}
  for i, uid in ipairs(order) do
    out[#out + 1] = uid
    out[#out + 1] = merge(old[i], by_user[uid])
  end
  chunked('HSET', key, out)
  redis.call('EXPIRE', key, seconds)
end

-- impressions: record, deadline index, and the user's open requests (uo: rid US ts RS ...)
local deadlines, opened, opened_order = {}, {}, {}
for _, im in ipairs(data[1]) do
  local rid, uid = im[1], im[2]
  if redis.call('EXISTS', p .. 'f:' .. rid) == 1
      or not redis.call('SET', p .. 'r:' .. rid, im[5], 'NX', 'EX', ttl) then
    dup = dup + 1
  else
    deadlines[#deadlines + 1] = im[4]
    deadlines[#deadlines + 1] = rid
    if not opened[uid] then
      opened[uid] = {}
      opened_order[#opened_order + 1] = uid
    end
    table.insert(opened[uid], rid .. '\31' .. im[3])
  end
end
chunked('ZADD', KEYS[1], deadlines)
update_users(p .. 'uo', opened, opened_order, function(old, new)
  local joined = table.concat(new, '\30')
  if old then return old .. '\30' .. joined end
  return joined
end, ttl)

-- the first `cap` relevant interactions of a user (cold start), per epoch of event time:
-- entries eid US ts RS ..., sorted by (ts, eid) like a sorted set trimmed by rank
local function merge_history(old, new)
  local entries, seen = {}, {}
  if old then
    for eid, ts in string.gmatch(old, '([^\30\31]*)\31([^\30]*)') do
      entries[#entries + 1] = {tonumber(ts), eid}
      seen[eid] = true
    end
  end
  for _, e in ipairs(new) do
    if not seen[e[2]] then
      entries[#entries + 1] = e
      seen[e[2]] = true
    end
  end
  table.sort(entries, function(a, b)
    if a[1] ~= b[1] then return a[1] < b[1] end
    return a[2] < b[2]
  end)
  local out = {}
  for i = 1, math.min(cap, #entries) do
    out[i] = entries[i][2] .. '\31' .. string.format('%d', entries[i][1])
  end
  return table.concat(out, '\30')
end
local history, history_order = {}, {}  -- epoch -> user -> entries; epoch -> users
local loose_users = {}
for _, it in ipairs(data[2]) do
  local eid, uid, rid, ts, grade = it[1], it[2], it[3], it[4], it[5]
  if grade > 0 then
    local epoch = math.floor(ts / (epoch_s * 1000))
    if not history[epoch] then
      history[epoch] = {}
      history_order[epoch] = {}
    end
    local mine = history[epoch]
    if not mine[uid] then
      mine[uid] = {}
      table.insert(history_order[epoch], uid)
    end
    table.insert(mine[uid], {ts, eid})
  end
  if rid ~= '' then
    local fk = p .. 'f:' .. rid
    if redis.call('EXISTS', fk) == 1 then
      if redis.call('HSETNX', fk, eid, 1) == 1 then late = late + 1 else dup = dup + 1 end
    else
      local k = p .. 'ri:' .. rid
      if redis.call('HSETNX', k, eid, it[6]) == 0 then
        dup = dup + 1
      else
        redis.call('EXPIRE', k, ttl)
      end
    end
  elseif ts < late_before then
    local xk = p .. 'ux:' .. uid
    if redis.call('SADD', xk, eid) == 1 then
      late = late + 1
      redis.call('EXPIRE', xk, ftl)
    else
      dup = dup + 1
    end
  else
    local lk = p .. 'ul:' .. uid
    if redis.call('ZADD', lk, 'NX', ts, it[7]) == 0 then
      dup = dup + 1
    else
      redis.call('EXPIRE', lk, ttl)
      if not loose_users[uid] or loose_users[uid] < ts then loose_users[uid] = ts end
    end
  end
end
for epoch, users in pairs(history) do
  update_users(p .. 'h:' .. epoch, users, history_order[epoch], merge_history, 2 * epoch_s + 86400)
end
-- users with request-less interactions (lu: user -> latest such time), so finalisation
-- reads and prunes ul: only for them
local lu = {}
for uid, ts in pairs(loose_users) do
  lu[#lu + 1] = ts
  lu[#lu + 1] = uid
end
if #lu > 0 then
  for i = 1, #lu, CHUNK do
    redis.call('ZADD', p .. 'lu', 'GT', unpack(lu, i, math.min(i + CHUNK - 1, #lu)))
  end
  redis.call('EXPIRE', p .. 'lu', ttl)
end
if dup > 0 then redis.call('HINCRBY', p .. 'c', 'duplicates', dup) end
if late > 0 then redis.call('HINCRBY', p .. 'c', 'late', late) end
return {dup, late}
