-- Merge partition progress: the larger event time wins; the wall-clock stamp always updates.
-- KEYS[1] = progress hash   ARGV = field, max_event_ms, updated_ms, field, ...
for i = 1, #ARGV, 3 do
  local old = redis.call('HGET', KEYS[1], ARGV[i])
  local best = tonumber(ARGV[i + 1])
  if old then
    local sep = string.find(old, ':', 1, true)
    local prev = tonumber(string.sub(old, 1, sep - 1))
    if prev > best then best = prev end
  end
  redis.call('HSET', KEYS[1], ARGV[i], string.format('%d:%s', best, ARGV[i + 2]))
end
return #ARGV / 3
