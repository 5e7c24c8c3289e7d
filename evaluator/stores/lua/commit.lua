-- Claim finalised requests of one shard and add their rows to window blocks, atomically.
-- A request already claimed (by this or another instance) or no longer open is skipped.
-- KEYS[1] = <tag>dl   ARGV[1] = key prefix with tag   ARGV[2] = msgpack list of
--   {request_id, user_id, variant, {{block suffix, bucket start, offset}, ...}}
-- ARGV[3] = state ttl s   ARGV[4] = block ttl s   ARGV[5] = doubles per block
-- ARGV[6] = doubles per row   ARGV[7] = prune loose interactions before (ms)
-- ARGV[8] = the requests' rows, packed little-endian doubles, one row after another
local p = ARGV[1]
local data = cmsgpack.unpack(ARGV[2])
local ttl, bttl = tonumber(ARGV[3]), tonumber(ARGV[4])
local nblock, nrow = tonumber(ARGV[5]), tonumber(ARGV[6])
local prune = ARGV[7]
local rowfmt = '<' .. string.rep('d', nrow)
local blockfmt = '<' .. string.rep('d', nblock)
local applied = 0
local pending = {}
local starts = {}
local rows = ARGV[8]
for i, r in ipairs(data) do
  local rid, uid, variant = r[1], r[2], r[3]
  local fk = p .. 'f:' .. rid
  if redis.call('EXISTS', fk) == 0 and redis.call('EXISTS', p .. 'r:' .. rid) == 1 then
    redis.call('HSET', fk, '_', 1)
    redis.call('EXPIRE', fk, ttl)
    redis.call('DEL', p .. 'r:' .. rid, p .. 'ri:' .. rid)
    redis.call('ZREM', KEYS[1], rid)
    redis.call('ZREM', p .. 'ui:' .. uid, rid)
    redis.call('ZREMRANGEBYSCORE', p .. 'ul:' .. uid, '-inf', '(' .. prune)
    redis.call('SADD', p .. 'vars', variant)
    local row = {struct.unpack(rowfmt, rows, (i - 1) * nrow * 8 + 1)}
    for _, b in ipairs(r[4]) do
      local list = pending[b[1]]
      if not list then
        list = {}
        pending[b[1]] = list
        starts[b[1]] = b[2]
      end
      list[#list + 1] = {b[3], row}
    end
    applied = applied + 1
  end
end
for suffix, list in pairs(pending) do
  local bk = p .. 'b:' .. suffix
  local cur = redis.call('GET', bk)
  local vals
  if cur then
    vals = {struct.unpack(blockfmt, cur)}
  else
    vals = {}
    for i = 1, nblock do vals[i] = 0.0 end
  end
  for _, entry in ipairs(list) do
    local off, row = entry[1], entry[2]
    for j = 1, nrow do vals[off + j] = vals[off + j] + row[j] end
  end
  redis.call('SET', bk, struct.pack(blockfmt, unpack(vals, 1, nblock)), 'EX', bttl)
  redis.call('ZADD', p .. 'bi', starts[suffix], suffix)
end
if applied > 0 then redis.call('HINCRBY', p .. 'c', 'finalised', applied) end
return applied
