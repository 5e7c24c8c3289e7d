-- Gather everything finalisation needs for one shard's due requests in one round trip.
-- KEYS[1] = <tag>dl   ARGV[1] = key prefix with tag   ARGV[2] = history epoch s
-- ARGV[3] = pending-interaction epoch ms
-- ARGV[4] = attribution window ms, or -1: return every request-less interaction
-- ARGV[5] = max clock skew ms   ARGV[6..] = request ids
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
-- interactions that could join one of the loaded requests (an interaction at t can
-- join an impression at s when s - skew <= t <= s + window); only those interactions
-- and the open requests that could compete for them (at most window before and skew
-- after them) are returned. Deadline entries of vanished requests are dropped.
local p = ARGV[1]
local history_ms = tonumber(ARGV[2]) * 1000
local pending_ms = tonumber(ARGV[3])
local window, skew = tonumber(ARGV[4]), tonumber(ARGV[5])
local function time_of(record)  -- user RS variant RS time RS ...
  local a = string.find(record, '\30', 1, true)
  local b = string.find(record, '\30', a + 1, true)
  local c = string.find(record, '\30', b + 1, true)
  return string.sub(record, 1, a - 1), tonumber(string.sub(record, b + 1, c - 1))
end
local asked = {}
for i = 6, #ARGV do asked[#asked + 1] = ARGV[i] end
local values = read('HMGET', p .. 'o', asked)
local rids, records, wanted, order, seen = {}, {}, {}, {}, {}
local times, span = {}, {}  -- span: user -> {earliest, latest} loaded request time
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
      span[uid] = {ts, ts}
    else
      span[uid] = {math.min(span[uid][1], ts), math.max(span[uid][2], ts)}
    end
    times[#times + 1] = ts
  else
    gone[#gone + 1] = rid
  end
end
chunked('ZREM', KEYS[1], gone)
if #rids == 0 then return {{}, {}} end
local pending = gather(epochs_around(times, pending_ms, 1, 1, p .. 'n:'), rids)
local requests = {}
for j, rid in ipairs(rids) do requests[j] = {rid, records[j], pending[j] or ''} end
-- per user: the stored history strings of the epochs (RS-joined), returned as they are
local hist = gather(epochs_around(times, history_ms, 1, 0, p .. 'h:'), order)
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
  if #loose > 0 and window >= 0 then
    -- only interactions that could join a loaded request matter here
    local kept, first, last = {}, span[uid][1] - skew, span[uid][2] + window
    for k = 1, #loose, 2 do
      local t = tonumber(loose[k + 1])
      if t >= first and t <= last then
        kept[#kept + 1] = loose[k]
        kept[#kept + 1] = loose[k + 1]
      end
    end
    loose = kept
  end
  if #loose > 0 then
    -- the user-based join needs the user's open requests that could compete for those
    -- interactions (uo: as stored, filtered) and the records of those not being loaded
    local low, high = math.huge, -math.huge
    for k = 2, #loose, 2 do
      local t = tonumber(loose[k])
      if t < low then low = t end
      if t > high then high = t end
    end
    if window >= 0 then low, high = low - window, high + skew else low, high = -math.huge, math.huge end
    local stored = redis.call('HGET', p .. 'uo', uid) or ''
    local other_ids, listed, others, open = {}, {}, {}, {}
    for entry, rid, ts in string.gmatch(stored, '(([^\30\31]*)\31([^\30]*))') do
      local at = tonumber(ts)
      if at >= low and at <= high then
        open[#open + 1] = entry
        if not listed[rid] and not wanted[rid] then other_ids[#other_ids + 1] = rid end
        listed[rid] = true
      end
    end
    open = table.concat(open, '\30')
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
