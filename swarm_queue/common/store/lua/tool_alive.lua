-- tool_alive: whether one runner still says it serves a tool (its time not run out by Redis's
-- clock): an asker whose call that runner began looks here before taking the try for lost.
-- KEYS: [1] the tool's runners (sorted set: label -> until, ms)
-- ARGV: [1] the runner's label
-- Returns 1 (it serves the tool) or 0.
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local until_ms = redis.call('ZSCORE', KEYS[1], ARGV[1])
if until_ms and tonumber(until_ms) > now then return 1 end
return 0
