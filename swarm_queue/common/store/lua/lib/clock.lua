-- Shared by every script that stores or compares a time: Redis's own clock, never a caller's
-- (the machines of a fleet disagree, by hours sometimes).

-- Now, in seconds to the millisecond, as the decimal string every stored time uses.
-- (Written from TIME's strings, with no number between: a string's tonumber costs Lua 5.1
-- a strtod, several times what the rest of this does.)
local function now_s()
  local t = redis.call('TIME')
  local us = t[2]
  return t[1] .. '.' .. string.sub(string.rep('0', 6 - #us) .. us, 1, 3)
end
