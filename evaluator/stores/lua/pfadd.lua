-- Add items to coverage sketches (HyperLogLog) and merge sketches into longer
-- windows' ones; idempotent (unions), so safe to retry.
-- KEYS[1] = routing key with the {<prefix>:cov} hash tag   ARGV[1] = ttl s
-- ARGV[2] = n, then n pairs of (sketch key, items joined by \31),
-- then pairs of (destination sketch, source sketch) to merge after the adds.
local ttl = tonumber(ARGV[1])
local n = tonumber(ARGV[2])
for i = 3, 2 + 2 * n, 2 do
  local key, chunk = ARGV[i], {}
  for item in string.gmatch(ARGV[i + 1], '[^\31]+') do
    chunk[#chunk + 1] = item
    if #chunk == 1000 then
      redis.call('PFADD', key, unpack(chunk))
      chunk = {}
    end
  end
  if #chunk > 0 then redis.call('PFADD', key, unpack(chunk)) end
  redis.call('EXPIRE', key, ttl)
end
for i = 3 + 2 * n, #ARGV, 2 do
  redis.call('PFMERGE', ARGV[i], ARGV[i + 1])
  redis.call('EXPIRE', ARGV[i], ttl)
end
return n
