-- lock: take or refresh the job's producer lock.
-- KEYS: [1] the lock
-- ARGV: [1] this holder's token, [2] ttl_ms
-- Returns the other holder's token, or nil when taken or refreshed.
local cur = redis.call('GET', KEYS[1])
if cur and cur ~= ARGV[1] then return cur end
redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
return false
