-- cache_get: the answers kept under some keys, each counted as used now. An answer unused for
-- longer than the TTL is expired on the way: deleted, not returned.
-- KEYS: [1] answers (hash: key -> answer), [2] used (sorted set: key -> last used, s)
-- ARGV: [1] ttl_s, then the keys (the time is Redis's: a caller's clock may be days off)
-- Returns one value per key: the answer, or false.
local answers, used = KEYS[1], KEYS[2]
local stamp = now_s()
local now, ttl = tonumber(stamp), tonumber(ARGV[1])
local keys = {}
for i = 2, #ARGV do keys[#keys + 1] = ARGV[i] end
local at = redis.call('ZMSCORE', used, unpack(keys))
local values = redis.call('HMGET', answers, unpack(keys))
local out, touched, expired = {}, {}, {}
for i, key in ipairs(keys) do
  local fresh = at[i] and now - tonumber(at[i]) <= ttl
  if fresh and values[i] then
    out[i] = values[i]
    touched[#touched + 1] = stamp
    touched[#touched + 1] = key
  else
    out[i] = false
    if at[i] or values[i] then expired[#expired + 1] = key end
  end
end
if #touched > 0 then redis.call('ZADD', used, unpack(touched)) end
if #expired > 0 then
  redis.call('ZREM', used, unpack(expired))
  redis.call('HDEL', answers, unpack(expired))
end
return out
