-- Add items to coverage sketches (HyperLogLog), then merge sketches into others.
-- KEYS[1] = any key of the coverage slot (routing)   ARGV[1] = ttl s
-- ARGV[2] = number of sketches to add to, n
-- ARGV[3 .. 2 + 2n] = sketch key, its items joined by U+001F (item ids cannot hold it)
-- ARGV[3 + 2n ..] = destination, source pairs to merge afterwards
-- One argument per sketch instead of one per item: the client packs a few long
-- strings instead of ~30 short ones per finalised request. PFADD and PFMERGE are
-- idempotent, so a retried call is harmless.
local ttl, n = tonumber(ARGV[1]), tonumber(ARGV[2])
for i = 3, 2 + 2 * n, 2 do
  local items = {}
  for item in string.gmatch(ARGV[i + 1], '[^\31]+') do items[#items + 1] = item end
  chunked('PFADD', ARGV[i], items)
  redis.call('EXPIRE', ARGV[i], ttl)
end
for i = 3 + 2 * n, #ARGV, 2 do
  redis.call('PFMERGE', ARGV[i], ARGV[i + 1])
  redis.call('EXPIRE', ARGV[i], ttl)
end
return n
