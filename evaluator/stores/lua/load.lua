-- Gather everything finalisation needs for one shard's due requests in one round trip.
-- KEYS[1] = <tag>dl   ARGV[1] = key prefix with tag   ARGV[2..] = request ids
-- Returns {requests, users}:
--   requests: {request_id, stored value, {event_id, pending value, ...}} for open ones
--   users:    {user_id, {loose member, ts, ...}, {history event, ts, ...},
--              {open request id, ts, ...}, {request id, stored value, ...}}
-- The user's open impressions (for the user-based join) are only read when the
-- user has request-less interactions. Deadline entries of vanished requests are dropped.
local p = ARGV[1]
local requests, users, seen_users, wanted = {}, {}, {}, {}
for i = 2, #ARGV do wanted[ARGV[i]] = true end
for i = 2, #ARGV do
  local rid = ARGV[i]
  local value = redis.call('GET', p .. 'r:' .. rid)
  if value then
    requests[#requests + 1] = {rid, value, redis.call('HGETALL', p .. 'ri:' .. rid)}
    local uid = string.sub(value, 1, string.find(value, '\30', 1, true) - 1)
    if not seen_users[uid] then
      seen_users[uid] = true
      local loose = redis.call('ZRANGE', p .. 'ul:' .. uid, 0, -1, 'WITHSCORES')
      local hist = redis.call('ZRANGE', p .. 'uh:' .. uid, 0, -1, 'WITHSCORES')
      local imps, others = {}, {}
      if #loose > 0 then
        imps = redis.call('ZRANGE', p .. 'ui:' .. uid, 0, -1, 'WITHSCORES')
        for j = 1, #imps, 2 do
          if not wanted[imps[j]] then
            local other = redis.call('GET', p .. 'r:' .. imps[j])
            if other then
              others[#others + 1] = imps[j]
              others[#others + 1] = other
            end
          end
        end
      end
      users[#users + 1] = {uid, loose, hist, imps, others}
    end
  else
    redis.call('ZREM', KEYS[1], rid)
  end
end
return {requests, users}
