-- tool_runners: how many live runners serve each tool (their time not run out by Redis's
-- clock).
-- KEYS: the runners of each tool asked about (sorted sets: label -> until, ms)
-- ARGV: none
-- Returns a count per key, in order.
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local out = {}
for i, key in ipairs(KEYS) do
  out[i] = redis.call('ZCOUNT', key, '(' .. now, '+inf')
end
return out
