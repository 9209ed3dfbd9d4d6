-- cache_put: keep answers, each counted as used now; then evict, at most 1000 per call (every
-- put evicts, so the cache comes back under its cap over the next puts): first the answers
-- unused for longer than the TTL, then the least recently used beyond the cap.
-- KEYS: [1] answers (hash: key -> answer), [2] used (sorted set: key -> last used, s)
-- ARGV: [1] ttl_s, [2] most answers kept, then key, answer for each (the time is Redis's)
-- Returns how many answers were evicted.
local answers, used = KEYS[1], KEYS[2]
local stamp = now_s()
local now, ttl, cap = tonumber(stamp), tonumber(ARGV[1]), tonumber(ARGV[2])
local pairs_, scores = {}, {}
for i = 3, #ARGV, 2 do
  pairs_[#pairs_ + 1] = ARGV[i]
  pairs_[#pairs_ + 1] = ARGV[i + 1]
  scores[#scores + 1] = stamp
  scores[#scores + 1] = ARGV[i]
end
if #pairs_ > 0 then
  redis.call('HSET', answers, unpack(pairs_))
  redis.call('ZADD', used, unpack(scores))
end
local budget = 1000
local old = redis.call('ZRANGEBYSCORE', used, '-inf', '(' .. (now - ttl), 'LIMIT', 0, budget)
local gone = #old
if gone > 0 then
  redis.call('ZREM', used, unpack(old))
  redis.call('HDEL', answers, unpack(old))
end
local over = math.min(redis.call('ZCARD', used) - cap, budget - gone)
if over > 0 then
  local popped = redis.call('ZPOPMIN', used, over)
  local victims = {}
  for i = 1, #popped, 2 do victims[#victims + 1] = popped[i] end
  redis.call('HDEL', answers, unpack(victims))
  gone = gone + #victims
end
return gone
