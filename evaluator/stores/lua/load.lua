-- Gather everything finalisation needs for one shard's due requests in one round trip.
-- KEYS[1] = <tag>dl   ARGV[1] = key prefix with tag   ARGV[2] = history epoch s
-- ARGV[3] = pending-interaction epoch ms   ARGV[4..] = request ids
-- Returns {requests, users}:
--   requests: {request_id, stored record, interactions naming it (RS-joined records)}
--             for the open ones
--   users:    user_id, history, extra, user_id, history, extra, ... where history is
--             the stored entries (event US time, RS-joined) and extra is '' or, for a
--             user with request-less interactions, {{loose member, ts, ...}, the
--             user's open requests as stored (request US time, RS-joined),
--             {other open request id, stored record, ...}}
-- Interactions naming a request are read from the epochs of its time and the epochs
-- either side; history from the epoch of its time and the one before. The user's open
-- impressions (for the user-based join) are only read when the user has request-less
-- interactions. Deadline entries of vanished requests are dropped.
local p = ARGV[1]
local history_ms = tonumber(ARGV[2]) * 1000
local pending_ms = tonumber(ARGV[3])
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
local times = {}
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
    times[#times + 1] = ts
  else
    gone[#gone + 1] = rid
  end
end
chunked('ZREM', KEYS[1], gone)
if #rids == 0 then return {{}, {}} end
local epoch_list = epochs_around(times, pending_ms, 1, 1)
local hepoch_list = epochs_around(times, history_ms, 1, 0)
local pending = {}
for _, e in ipairs(epoch_list) do
  local got = read('HMGET', p .. 'n:' .. e, rids)
  for j = 1, #rids do
    if got[j] then pending[j] = pending[j] and (pending[j] .. '\30' .. got[j]) or got[j] end
  end
end
local requests = {}
for j, rid in ipairs(rids) do requests[j] = {rid, records[j], pending[j] or ''} end
-- per user: the stored history strings of the epochs (RS-joined), returned as they are
local hist = {}
for _, e in ipairs(hepoch_list) do
  local got = read('HMGET', p .. 'h:' .. e, order)
  for j = 1, #order do
    if got[j] then hist[j] = hist[j] and (hist[j] .. '\30' .. got[j]) or got[j] end
  end
end
local has_loose = read('ZMSCORE', p .. 'lu', order)
local users = {}
for j, uid in ipairs(order) do
  local loose = {}
  if has_loose[j] then
    loose = redis.call('ZRANGE', p .. 'ul:' .. uid, 0, -1, 'WITHSCORES')
    if #loose == 0 then redis.call('ZREM', p .. 'lu', uid) end
  end
  users[#users + 1] = uid
  users[#users + 1] = hist[j] or ''
  if #loose > 0 then
    -- the user-based join needs the user's open requests (uo: as stored) and the
    -- records of those not being loaded
    local open = redis.call('HGET', p .. 'uo', uid) or ''
    local other_ids, listed, others = {}, {}, {}
    for rid in string.gmatch(open, '([^\30\31]*)\31[^\30]*') do
      if not listed[rid] and not wanted[rid] then other_ids[#other_ids + 1] = rid end
      listed[rid] = true
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
    users[#users + 1] = {loose, open, others}
  else
    users[#users + 1] = ''
  end
end
return {requests, users}
