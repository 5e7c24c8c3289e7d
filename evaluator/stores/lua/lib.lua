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
