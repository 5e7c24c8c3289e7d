-- One partition's checkpoint after a batch, atomically and only for its current owner:
-- the changelog delta of its join state, its offsets and event time, its exactly-once
-- counters and the window aggregates with the requests it finalised: the totals of
-- each array it adds to, summed by the owner (totals.py), so this script copies bytes.
-- KEYS[1] = <tag>pm (partition meta: epoch, offsets, event times)
-- ARGV[1] = key prefix with tag   ARGV[2] = the writer's epoch
-- ARGV[3] = msgpack {{}, {deleted field, ...}, {meta field, value, ...},
--           {counter, increment, ...}, {block suffix, bucket start, ttl s, window ms}...,
--           {day, {propensity field, increment, ...}, ...}, {variant, ...},
--           {experiment US variant, ...}, {experiment US variant, users, ...}}
-- ARGV[4] = doubles per block   ARGV[5] = the blocks' totals (little-endian doubles,
--           one block after another)   ARGV[6] = propensity history ms
-- ARGV[7] = checkpoints the writer has written (seq): this one must follow it
-- ARGV[8] = per changelog field written, its name's and value's length in bytes
--           (little-endian uint32 pairs); ARGV[11] and ARGV[12]: the names, and the
--           values, each concatenated (raw bytes: three arguments instead of two per
--           field, which the client would pack one by one)
-- ARGV[9] = the totals of each experiment's cumulative block (as ARGV[5]), in the
--           order of data[8]; data[9]: users first exposed per experiment and variant
-- ARGV[10] = the receipt (epoch:seq) that this checkpoint's coverage-sketch writes left in
--           'sk', set after them; '' when it wrote none. Missing: Redis lost them
--           (restarted from an older AOF between the two), so this must not be applied.
-- ARGV[13] = unused (was the rows per block, when this script widened old blocks: the
--           owner reads them widened now)
-- ARGV[14] = the regression history's totals (doubles, as ARGV[5]), in the order of
--           data[10] ({name, hour start, doubles, ...}); ARGV[15] = unused (was the
--           doubles per history array); ARGV[16] = the history kept, ms of event time
-- Returns 1 when written; otherwise writes nothing and returns 0 when a newer owner has
-- claimed the partition, -1 when the stored copy is not the writer's last (lost writes).
local p = ARGV[1]
local meta = redis.call('HMGET', KEYS[1], 'epoch', 'seq')
local epoch, mine = tonumber(meta[1]) or 0, tonumber(ARGV[2])
if epoch > mine then return 0 end
if epoch < mine or (tonumber(meta[2]) or 0) ~= tonumber(ARGV[7]) then return -1 end
if ARGV[10] ~= '' and redis.call('HGET', KEYS[1], 'sk') ~= ARGV[10] then return -1 end
redis.call('HSET', KEYS[1], 'seq', tonumber(ARGV[7]) + 1)
local data = cmsgpack.unpack(ARGV[3])
local state = p .. 'state'
local written, lens, names, values = {}, ARGV[8], ARGV[11], ARGV[12]
local a, b, fields = 1, 1, #lens / 8
for first = 0, fields - 1, 2000 do  -- 2 x 2000 lengths per unpack (Lua's limit ~8000)
  local n = math.min(2000, fields - first)
  local len = {struct.unpack('<' .. string.rep('I', 2 * n), lens, first * 8 + 1)}
  for j = 1, 2 * n, 2 do
    written[#written + 1] = string.sub(names, a, a + len[j] - 1)
    written[#written + 1] = string.sub(values, b, b + len[j + 1] - 1)
    a, b = a + len[j], b + len[j + 1]
  end
end
chunked('HSET', state, written)
chunked('HDEL', state, data[2])
chunked('HSET', KEYS[1], data[3])
local counters = data[4]
for i = 1, #counters, 2 do redis.call('HINCRBY', p .. 'c', counters[i], counters[i + 1]) end
if #data[5] > 0 then set_blocks(p, data[5], ARGV[5], tonumber(ARGV[4])) end
if #data[6] > 0 then add_propensity(p, data[6], tonumber(ARGV[6])) end
for _, variant in ipairs(data[7]) do redis.call('SADD', p .. 'vars', variant) end
local nblock = tonumber(ARGV[4])
for i, key in ipairs(data[8]) do  -- cumulative since the experiment's start: no TTL
  set_block(p .. 'x:' .. key, ARGV[9], (i - 1) * nblock * 8 + 1, nblock, nil)
  redis.call('SADD', p .. 'xv', key)
end
local history = data[10]
if history and #history > 0 then
  set_history(p, history, ARGV[14], tonumber(ARGV[16]))
end
local exposed = data[9]
for i = 1, #exposed, 2 do redis.call('HINCRBY', p .. 'xu', exposed[i], exposed[i + 1]) end
return 1
