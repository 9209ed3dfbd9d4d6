-- tool_serve: a tool runner says which tools it serves, until when (by Redis's clock, never a
-- runner's), or that it serves them no more; the runners whose time ran out are dropped.
-- KEYS: the runners of each tool the runner allows (sorted sets: label -> until, ms)
-- ARGV: [1] the runner's label, [2] how long it serves them from now (ms; 0: it leaves)
-- Returns the number of tools it now serves.
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local ttl = tonumber(ARGV[2])
for _, key in ipairs(KEYS) do
  redis.call('ZREMRANGEBYSCORE', key, '-inf', now)
  if ttl > 0 then
    redis.call('ZADD', key, now + ttl, ARGV[1])
    redis.call('PEXPIRE', key, ttl * 2)
  else
    redis.call('ZREM', key, ARGV[1])
  end
end
if ttl > 0 then return #KEYS end
return 0
