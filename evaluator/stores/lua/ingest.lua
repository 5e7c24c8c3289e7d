-- Ingest one shard's events idempotently. All keys share the shard's hash tag.
-- KEYS[1] = <tag>dl (deadline index; routing key)   ARGV[1] = key prefix with tag
-- ARGV[2] = msgpack {impressions, interactions}   ARGV[3] = state ttl s
-- ARGV[4] = history cap   ARGV[5] = history ttl s   ARGV[6] = loose late-before ms
-- ARGV[7] = finalised-marker ttl s (ux: sets remember late request-less interactions)
-- impression:  {request_id, user_id, ts, deadline, stored value}
-- interaction: {event_id, user_id, request_id or "", ts, grade, pending value, loose member}
local p = ARGV[1]
local data = cmsgpack.unpack(ARGV[2])
local ttl = tonumber(ARGV[3])
local cap = tonumber(ARGV[4])
local httl = tonumber(ARGV[5])
local late_before = tonumber(ARGV[6])
local ftl = tonumber(ARGV[7])
local dup, late = 0, 0
local ttl_set = {}  -- keys whose TTL this call already refreshed (one EXPIRE per key)
local function touch(key, seconds)
  if not ttl_set[key] then
    ttl_set[key] = true
    redis.call('EXPIRE', key, seconds)
  end
end
for _, im in ipairs(data[1]) do
  local rid, uid = im[1], im[2]
  if redis.call('EXISTS', p .. 'f:' .. rid) == 1
      or not redis.call('SET', p .. 'r:' .. rid, im[5], 'NX', 'EX', ttl) then
    dup = dup + 1
  else
    redis.call('ZADD', KEYS[1], im[4], rid)
    local uk = p .. 'ui:' .. uid
    redis.call('ZADD', uk, im[3], rid)
    touch(uk, ttl)
  end
end
for _, it in ipairs(data[2]) do
  local eid, uid, rid, ts, grade = it[1], it[2], it[3], it[4], it[5]
  if grade > 0 then
    local hk = p .. 'uh:' .. uid
    if redis.call('ZADD', hk, ts, eid) == 1 then
      redis.call('ZREMRANGEBYRANK', hk, cap, -1)
      touch(hk, httl)
    end
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
        touch(k, ttl)
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
    end
  end
end
if dup > 0 then redis.call('HINCRBY', p .. 'c', 'duplicates', dup) end
if late > 0 then redis.call('HINCRBY', p .. 'c', 'late', late) end
return {dup, late}
