-- lock: take or refresh a lock held by a token (a job's producer lock, a batch's lease), or
-- let go of it: in one step, so a lock that passed to another holder meanwhile stays theirs.
-- KEYS: [1] the lock
-- ARGV: [1] this holder's token, [2] ttl_ms (0: let go, if this holder has it)
-- Returns the other holder's token, or nil when taken, refreshed or let go.
local cur = redis.call('GET', KEYS[1])
if cur and cur ~= ARGV[1] then return cur end
if tonumber(ARGV[2]) == 0 then
  if cur then redis.call('DEL', KEYS[1]) end
  return false
end
redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
return false
