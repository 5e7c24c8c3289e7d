-- Add items to coverage sketches (HyperLogLog); idempotent, so safe to retry.
-- KEYS[1] = routing key with the {<prefix>:cov} hash tag   ARGV[1] = ttl s
-- ARGV[2], ARGV[3], ... = pairs of (sketch key, items joined by \31)
local ttl = tonumber(ARGV[1])
for i = 2, #ARGV, 2 do
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
return (#ARGV - 1) / 2
