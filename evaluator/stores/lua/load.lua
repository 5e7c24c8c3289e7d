-- Gather everything finalisation needs for one shard's due requests in one round trip.
-- KEYS[1] = <tag>dl   ARGV[1] = key prefix with tag   ARGV[2] = history epoch s
-- ARGV[3] = pending-interaction epoch ms   ARGV[4..] = request ids
-- Returns {requests, users}:
--   requests: {request_id, stored record, interactions naming it (RS-joined records)}
--             for the open ones
--   users:    {user_id, {loose member, ts, ...}, {history event, ts, ...},
--              {open request id, ts, ...}, {request id, stored record, ...}}
-- Interactions naming a request are read from the epochs of its time and the epochs
-- either side; history from the epoch of its time and the one before. The user's open
-- impressions (for the user-based join) are only read when the user has request-less
-- interactions. Deadline entries of vanished requests are dropped.
local p = ARGV[1]
local history_ms = tonumber(ARGV[2]) * 1000
local pending_ms = tonumber(ARGV[3])
local CHUNK = 4000
local function read(command, key, names)
  local out = {}
  for i = 1, #names, CHUNK do
    local got = redis.call(command, key, unpack(names, i, math.min(i + CHUNK - 1, #names)))
    for j = 1, #got do out[i + j - 1] = got[j] end
  end
  return out
end
local function time_of(record)  -- user RS variant RS time RS ...
  local a = string.find(record, '\30', 1, true)
  local b = string.find(record, '\30', a + 1, true)
  local c = string.find(record, '\30', b + 1, true)
  return string.sub(record, 1, a - 1), tonumber(string.sub(record, b + 1, c - 1))
end
local asked = {}
for i = 4, #ARGV do asked[#asked + 1] = ARGV[i] end
local values = read('HMGET', p .. 'o', asked)
local rids, records, wanted, order, seen = {}, {}, {}, {}, {}
local epochs, epoch_list, hepochs, hepoch_list = {}, {}, {}, {}
local gone = {}
for i, rid in ipairs(asked) do
  local value = values[i]
  if value then
    rids[#rids + 1] = rid
    records[#records + 1] = value
    wanted[rid] = true
    local uid, ts = time_of(value)
    if not seen[uid] then
      seen[uid] = true
      order[#order + 1] = uid
    end
    local e = math.floor(ts / pending_ms)
    for x = e - 1, e + 1 do
      if not epochs[x] then
        epochs[x] = true
        epoch_list[#epoch_list + 1] = x
      end
    end
    local h = math.floor(ts / history_ms)
    for x = h - 1, h do
      if not hepochs[x] then
        hepochs[x] = true
        hepoch_list[#hepoch_list + 1] = x
      end
    end
  else
    gone[#gone + 1] = rid
  end
end
for i = 1, #gone, CHUNK do
  redis.call('ZREM', KEYS[1], unpack(gone, i, math.min(i + CHUNK - 1, #gone)))
end
if #rids == 0 then return {{}, {}} end
local pending = {}
for _, e in ipairs(epoch_list) do
  local got = read('HMGET', p .. 'n:' .. e, rids)
  for j = 1, #rids do
    if got[j] then pending[j] = pending[j] and (pending[j] .. '\30' .. got[j]) or got[j] end
  end
end
local requests = {}
for j, rid in ipairs(rids) do requests[j] = {rid, records[j], pending[j] or ''} end
local hist = {}
for _, e in ipairs(hepoch_list) do
  local got = read('HMGET', p .. 'h:' .. e, order)
  for j = 1, #order do
    if got[j] then
      local flat = hist[j] or {}
      for eid, ts in string.gmatch(got[j], '([^\30\31]*)\31([^\30]*)') do
        flat[#flat + 1] = eid
        flat[#flat + 1] = ts
      end
      hist[j] = flat
    end
  end
end
local has_loose = read('ZMSCORE', p .. 'lu', order)
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
    local other_ids = {}
    for _, e in ipairs(entries) do
      imps[#imps + 1] = e[2]
      imps[#imps + 1] = string.format('%d', e[1])
      if not wanted[e[2]] then other_ids[#other_ids + 1] = e[2] end
    end
    if #other_ids > 0 then
      local got = read('HMGET', p .. 'o', other_ids)
      for k, rid in ipairs(other_ids) do
        if got[k] then
          others[#others + 1] = rid
          others[#others + 1] = got[k]
        end
      end
    end
  end
  users[#users + 1] = {uid, loose, hist[j] or {}, imps, others}
end
return {requests, users}
