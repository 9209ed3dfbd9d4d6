-- Shared by every script that stores or compares a time: Redis's own clock, never a caller's
-- (the machines of a fleet disagree, by hours sometimes).

-- Now, in seconds to the millisecond, as the decimal string every stored time uses.
local function now_s()
  local t = redis.call('TIME')
  return string.format('%d.%03d', tonumber(t[1]), math.floor(tonumber(t[2]) / 1000))
end
