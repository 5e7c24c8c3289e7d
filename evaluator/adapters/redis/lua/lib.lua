-- Helpers shared by the scripts: the store prepends this file to each of them
-- (a script cannot load another).
local CHUNK = 4000  -- values per command: Lua's unpack takes at most ~8000
-- `command key v1 v2 ...` over a long list, CHUNK values at a time
local function chunked(command, key, list)
  for i = 1, #list, CHUNK do
    redis.call(command, key, unpack(list, i, math.min(i + CHUNK - 1, #list)))
  end
end
-- HSET of a flat field/value list (if not empty), then EXPIRE
local function hset_expire(key, flat, seconds)
  if #flat > 0 then
    chunked('HSET', key, flat)
    redis.call('EXPIRE', key, seconds)
  end
end
-- a map as a flat list: key, value, ... (value, key, ... if `value_first`)
local function flatten(map, value_first)
  local flat = {}
  for k, v in pairs(map) do
    if value_first then k, v = v, k end
    flat[#flat + 1] = k
    flat[#flat + 1] = v
  end
  return flat
end
-- one multi-field read of `names`: a table parallel to them (false where absent)
local function read(command, key, names)
  local out = {}
  for i = 1, #names, CHUNK do
    local got = redis.call(command, key, unpack(names, i, math.min(i + CHUNK - 1, #names)))
    for j = 1, #got do out[i + j - 1] = got[j] end
  end
  return out
end
-- the fields `names` of several hashes, each name's values joined by RS (false if none)
local function gather(keys, names)
  local out = {}
  for _, key in ipairs(keys) do
    local got = read('HMGET', key, names)
    for j = 1, #names do
      if got[j] then out[j] = out[j] and (out[j] .. '\30' .. got[j]) or got[j] end
    end
  end
  return out
end
-- read the fields `names` of hash `key`, pass each old value (or false) with its
-- position to `merge`, and write back the non-nil results in one HSET (then EXPIRE)
local function update(key, names, merge, seconds)
  local old, out = read('HMGET', key, names), {}
  for i, name in ipairs(names) do
    local value = merge(old[i], i)
    if value then
      out[#out + 1] = name
      out[#out + 1] = value
    end
  end
  hset_expire(key, out, seconds)
end
-- the distinct epochs (time // length) from `before` below to `after` above each time
-- (as keys: `prefix` .. epoch)
local function epochs_around(times, length, before, after, prefix)
  local seen, list = {}, {}
  for _, t in ipairs(times) do
    local e = math.floor(t / length)
    for x = e - before, e + after do
      if not seen[x] then
        seen[x] = true
        list[#list + 1] = prefix .. x
      end
    end
  end
  return list
end
-- write the totals of blocks (blocks: {suffix, bucket start, ttl s, window ms}; totals:
-- the little-endian doubles of each block in turn, summed by the partition's owner,
-- evaluator/adapters/redis/totals.py) of prefix `p`, recording each in its window's
-- index (bi:) and change log (mod:, by a per-prefix version)
local function set_block(key, totals, at, nblock, ttl)  -- ttl nil: kept until deleted
  local value = string.sub(totals, at, at + nblock * 8 - 1)
  if ttl then redis.call('SET', key, value, 'EX', ttl) else redis.call('SET', key, value) end
end
local function set_blocks(p, blocks, totals, nblock)
  local version = redis.call('INCR', p .. 'ver')
  local oldest = {}
  for i, b in ipairs(blocks) do
    set_block(p .. 'b:' .. b[1], totals, (i - 1) * nblock * 8 + 1, nblock, b[3])
    redis.call('ZADD', p .. 'bi:' .. b[4], b[2], b[1])
    redis.call('ZADD', p .. 'mod:' .. b[4], version, b[1])
    local cutoff = b[2] - 2 * b[4]
    if not oldest[b[4]] or cutoff < oldest[b[4]] then oldest[b[4]] = cutoff end
  end
  -- forget and delete blocks that fell two window lengths behind the oldest written
  -- (bounded by event time; the TTL only backs this up)
  for window, cutoff in pairs(oldest) do
    local index = p .. 'bi:' .. window
    local gone = redis.call('ZRANGEBYSCORE', index, '-inf', '(' .. cutoff, 'LIMIT', 0, 1000)
    if #gone > 0 then
      redis.call('ZREM', p .. 'mod:' .. window, unpack(gone))
      redis.call('ZREM', index, unpack(gone))
      local keys = {}
      for j, name in ipairs(gone) do keys[j] = p .. 'b:' .. name end
      redis.call('DEL', unpack(keys))
    end
  end
end
-- write the regression history's arrays (hist: {name, hour start, doubles, ...};
-- totals: their little-endian doubles in turn) of prefix `p`, indexed by hour in 'rhi';
-- arrays more than `keep` ms of event time behind the newest written are deleted
local function set_history(p, hist, totals, keep)
  local index, ttl = p .. 'rhi', math.floor(keep / 1000) + 86400
  local newest
  local at = 1
  for i = 1, #hist, 3 do
    set_block(p .. 'rh:' .. hist[i], totals, at, hist[i + 2], ttl)
    at = at + hist[i + 2] * 8
    redis.call('ZADD', index, hist[i + 1], hist[i])
    if not newest or hist[i + 1] > newest then newest = hist[i + 1] end
  end
  local first = string.format('%d', newest - keep)
  local gone = redis.call('ZRANGEBYSCORE', index, '-inf', '(' .. first, 'LIMIT', 0, 1000)
  if #gone > 0 then
    redis.call('ZREM', index, unpack(gone))
    local keys = {}
    for j, name in ipairs(gone) do keys[j] = p .. 'rh:' .. name end
    redis.call('DEL', unpack(keys))
  end
  redis.call('EXPIRE', index, ttl)
end
-- add the propensity estimators' counters ({day, {field, increment, ...}, ...}) of
-- prefix `p`, dropping days older than `history` ms before the newest
local function add_propensity(p, ps, history)
  local days = p .. 'psd'
  for i = 1, #ps, 2 do
    local key, incs = p .. 'ps:' .. ps[i], ps[i + 1]
    for j = 1, #incs, 2 do redis.call('HINCRBY', key, incs[j], incs[j + 1]) end
    redis.call('EXPIRE', key, math.floor(history / 1000) + 86400)
    redis.call('ZADD', days, tonumber(ps[i]), ps[i])
  end
  local newest = tonumber(redis.call('ZRANGE', days, -1, -1, 'WITHSCORES')[2])
  local first_day = newest - math.floor((history - 1) / 86400000) * 86400000
  local gone = redis.call('ZRANGEBYSCORE', days, '-inf', '(' .. first_day)
  for _, day in ipairs(gone) do redis.call('DEL', p .. 'ps:' .. day) end
  redis.call('ZREMRANGEBYSCORE', days, '-inf', '(' .. first_day)
  redis.call('EXPIRE', days, math.floor(history / 1000) + 86400)
end
