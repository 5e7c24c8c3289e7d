-- Ingest one shard's events idempotently. All keys share the shard's hash tag.
-- KEYS[1] = <tag>dl (deadline index; routing key)   ARGV[1] = key prefix with tag
-- ARGV[2] = msgpack {impressions, interactions}   ARGV[3] = state ttl s
-- ARGV[4] = history cap   ARGV[5] = history epoch s   ARGV[6] = loose late-before ms
-- ARGV[7] = finalised-marker ttl s   ARGV[8] = pending-interaction epoch ms
-- ARGV[9] = finalised-marker period ms
-- impression:  {request_id, user_id, ts, deadline, stored value}
-- interaction: {event_id, user_id, request_id or "", ts, grade, stored}: stored is the
--              pending record when it names a request, else the loose member
-- State lives in per-shard hashes written with one multi-field command per batch (a
-- redis.call, and above all a new key, costs far more than one more field):
--   o: request -> record; dl: request -> deadline; n:<epoch>: request -> records of
--   the interactions naming it (RS-joined, by the interactions' event-time epoch);
--   fin:<period>: finalised request -> ids of the interactions applied or counted late
--   (the period its deadline falls in; the periods kept are listed in fdays).
local p = ARGV[1]
local data = cmsgpack.unpack(ARGV[2])
local ttl = tonumber(ARGV[3])
local cap = tonumber(ARGV[4])
local epoch_s = tonumber(ARGV[5])
local late_before = tonumber(ARGV[6])
local ftl = tonumber(ARGV[7])
local pending_ms = tonumber(ARGV[8])
local PERIOD = tonumber(ARGV[9])
local dup, late = 0, 0
-- is `id` one of the RS-joined ids at the start of each RS-separated part of `list`?
local function listed(list, id)
  return string.find('\30' .. list .. '\31', '\30' .. id .. '\31', 1, true) ~= nil
      or string.find('\30' .. list .. '\30', '\30' .. id .. '\30', 1, true) ~= nil
end
-- writes fields of several hashes: changes[key] = {field -> value}, one HSET per key
local function write_fields(changes, seconds)
  for key, fields in pairs(changes) do
    hset_expire(key, flatten(fields), seconds)
  end
end
local periods = redis.call('ZRANGE', p .. 'fdays', 0, -1)

-- impressions: new unless open (in dl) or finalised (fin:<period of the deadline>)
local fresh, seen = {}, {}
for _, im in ipairs(data[1]) do
  if seen[im[1]] then dup = dup + 1 else
    seen[im[1]] = true
    fresh[#fresh + 1] = im
  end
end
if #fresh > 0 then
  local rids, by_period = {}, {}
  for i, im in ipairs(fresh) do rids[i] = im[1] end
  local open = read('ZMSCORE', KEYS[1], rids)
  for i, im in ipairs(fresh) do
    if open[i] then
      dup = dup + 1
      fresh[i] = false
    else
      local period = im[4] - im[4] % PERIOD
      by_period[period] = by_period[period] or {}
      table.insert(by_period[period], i)
    end
  end
  for period, members in pairs(by_period) do
    local names = {}
    for j, i in ipairs(members) do names[j] = fresh[i][1] end
    local done = read('HMGET', p .. 'fin:' .. string.format('%d', period), names)
    for j, i in ipairs(members) do
      if done[j] then
        dup = dup + 1
        fresh[i] = false
      end
    end
  end
  local records, deadlines, opened, order = {}, {}, {}, {}
  for _, im in ipairs(fresh) do
    if im then
      local rid, uid = im[1], im[2]
      records[#records + 1] = rid
      records[#records + 1] = im[5]
      deadlines[#deadlines + 1] = im[4]
      deadlines[#deadlines + 1] = rid
      if not opened[uid] then
        opened[uid] = {}
        order[#order + 1] = uid
      end
      table.insert(opened[uid], rid .. '\31' .. string.format('%d', im[3]))
    end
  end
  if #records > 0 then
    chunked('HSET', p .. 'o', records)
    redis.call('EXPIRE', p .. 'o', ttl)
    chunked('ZADD', KEYS[1], deadlines)
    -- the user's open requests (uo: rid US ts, RS-joined) for the user-based join
    update(p .. 'uo', order, function(old, i)
      local joined = table.concat(opened[order[i]], '\30')
      return old and (old .. '\30' .. joined) or joined
    end, ttl)
  end
end

-- interactions
local history, history_order = {}, {}  -- epoch -> user -> {ts, eid}; epoch -> users
local loose_users = {}
local named = {}  -- request id -> {interaction, ...} in batch order
local named_order = {}
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
    if not named[rid] then
      named[rid] = {}
      named_order[#named_order + 1] = rid
    end
    table.insert(named[rid], it)
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
    if redis.call('ZADD', lk, 'NX', ts, it[6]) == 0 then
      dup = dup + 1
    else
      redis.call('EXPIRE', lk, ttl)
      if not loose_users[uid] or loose_users[uid] < ts then loose_users[uid] = ts end
    end
  end
end

-- interactions naming a request: kept under the request if it is open, late (or
-- repeated) if it is finalised, else kept too (it may arrive before its impression)
if #named_order > 0 then
  local final = {}  -- request id -> {period, applied ids}
  local open = read('ZMSCORE', KEYS[1], named_order)
  local closed = {}
  for i, rid in ipairs(named_order) do
    if not open[i] then closed[#closed + 1] = rid end
  end
  if #closed > 0 then
    for _, period in ipairs(periods) do
      local got = read('HMGET', p .. 'fin:' .. period, closed)
      for i, rid in ipairs(closed) do
        if got[i] and not final[rid] then final[rid] = {period, got[i]} end
      end
    end
  end
  local fin_changes, pending = {}, {}  -- key -> {field -> value}; epoch -> rid -> {records}
  local pending_order = {}
  for _, rid in ipairs(named_order) do
    local f = final[rid]
    for _, it in ipairs(named[rid]) do
      local eid = it[1]
      if f then
        if listed(f[2], eid) then dup = dup + 1 else
          late = late + 1
          f[2] = (f[2] == '') and eid or (f[2] .. '\30' .. eid)
          local key = p .. 'fin:' .. f[1]
          fin_changes[key] = fin_changes[key] or {}
          fin_changes[key][rid] = f[2]
        end
      else
        local epoch = math.floor(it[4] / pending_ms)
        if not pending[epoch] then
          pending[epoch] = {}
          pending_order[epoch] = {}
        end
        if not pending[epoch][rid] then
          pending[epoch][rid] = {}
          table.insert(pending_order[epoch], rid)
        end
        table.insert(pending[epoch][rid], it)
      end
    end
  end
  write_fields(fin_changes, ftl)
  for epoch, by_rid in pairs(pending) do
    local rids = pending_order[epoch]
    update(p .. 'n:' .. epoch, rids, function(list, i)
      local added = false
      for _, it in ipairs(by_rid[rids[i]]) do
        if list and listed(list, it[1]) then dup = dup + 1 else
          list = list and (list .. '\30' .. it[6]) or it[6]
          added = true
        end
      end
      return added and list or nil
    end, math.floor(3 * pending_ms / 1000) + ttl)
  end
end

-- the first `cap` relevant interactions of a user (cold start), per epoch of event time:
-- entries eid US ts, RS-joined, sorted by (ts, eid) like a sorted set trimmed by rank
-- returns the new value, or nil when nothing changes (the common case once a user has
-- `cap` earlier interactions)
-- the id of the entry whose unit separator is at `us` (the last entry)
local function last_id(list, us)
  local rs = string.find(list, '\30[^\30]*$')
  return string.sub(list, rs and rs + 1 or 1, us - 1)
end
local function merge_history(old, new)
  if #new == 1 then
    local e = new[1]
    if not old then return e[2] .. '\31' .. string.format('%d', e[1]) end
    -- the common case: one interaction after every stored one (in event-time order)
    -- is appended, or dropped when the list is full; no parsing or sorting
    -- (anchored patterns that start with a separator: an unanchored capture of the
    -- last entry's id backtracks at every position and cost 9x more)
    local us, _, ts = string.find(old, '\31(%d+)$')
    ts = tonumber(ts)
    if ts and (e[1] > ts or (e[1] == ts and e[2] > last_id(old, us)))
        and not string.find('\30' .. old, '\30' .. e[2] .. '\31', 1, true) then
      local stored, at = 1, 0
      repeat
        at = string.find(old, '\30', at + 1, true)
        if at then stored = stored + 1 end
      until not at or stored >= cap
      if stored >= cap then return nil end
      return old .. '\30' .. e[2] .. '\31' .. string.format('%d', e[1])
    end
  end
  local entries, known = {}, {}
  if old then
    for eid, ts in string.gmatch(old, '([^\30\31]*)\31([^\30]*)') do
      entries[#entries + 1] = {tonumber(ts), eid}
      known[eid] = true
    end
  end
  local full, last = #entries >= cap, entries[#entries]
  local changed = false
  for _, e in ipairs(new) do
    if not known[e[2]] then
      -- an interaction after the last of a full stored list cannot enter it
      if not (full and (e[1] > last[1] or (e[1] == last[1] and e[2] > last[2]))) then
        entries[#entries + 1] = e
        changed = true
      end
      known[e[2]] = true
    end
  end
  if not changed then return nil end
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
for epoch, users in pairs(history) do
  local order = history_order[epoch]
  update(p .. 'h:' .. epoch, order, function(old, i)
    return merge_history(old, users[order[i]])
  end, 2 * epoch_s + 86400)
end
-- users with request-less interactions (lu: user -> latest such time), so finalisation
-- reads and prunes ul: only for them
local lu = flatten(loose_users, true)  -- score (time), member (user)
if #lu > 0 then
  for i = 1, #lu, CHUNK do  -- (chunked() cannot pass the GT flag)
    redis.call('ZADD', p .. 'lu', 'GT', unpack(lu, i, math.min(i + CHUNK - 1, #lu)))
  end
  redis.call('EXPIRE', p .. 'lu', ttl)
end
if dup > 0 then redis.call('HINCRBY', p .. 'c', 'duplicates', dup) end
if late > 0 then redis.call('HINCRBY', p .. 'c', 'late', late) end
return {dup, late}
