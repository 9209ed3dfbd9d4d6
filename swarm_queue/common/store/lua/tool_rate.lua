-- tool_rate: a turn for one run of a tool whose calls are limited to a rate across every
-- runner: the next free moment is kept in Redis (by Redis's clock, never a runner's), each
-- turn takes the next one, an interval apart. A turn further off than max wait is not taken.
-- KEYS: [1] the tool's next free moment (seconds, as now_s writes them)
-- ARGV: [1] interval (s), [2] max wait (s)
-- Returns the wait before the run (ms), or -1 when it would be longer than max wait.
local now = tonumber(now_s())
local at = math.max(now, tonumber(redis.call('GET', KEYS[1]) or '0'))
-- (The moment is kept to the millisecond: a turn within one of max wait is within it.)
if at - now > tonumber(ARGV[2]) + 0.001 then return -1 end
local after = at + tonumber(ARGV[1])
redis.call('SET', KEYS[1], string.format('%.3f', after), 'PX', math.ceil((after - now) * 1000) + 1000)
return math.floor((at - now) * 1000)
