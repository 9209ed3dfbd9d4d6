-- start: mark entries as running. Their commit or release takes the mark back, so a mark still
-- there when an entry is taken again is a worker that died running it.
-- KEYS: [1] running
-- ARGV: the entry IDs
-- Returns how many were marked.
-- One HMGET and one HSET per chunk rather than an HINCRBY per entry (cheaper for Redis).
for lo = 1, #ARGV, 500 do
  local ids = {unpack(ARGV, lo, math.min(lo + 499, #ARGV))}
  local marks = redis.call('HMGET', KEYS[1], unpack(ids))
  local args = {}
  for i, id in ipairs(ids) do
    args[#args + 1] = id
    args[#args + 1] = (tonumber(marks[i]) or 0) + 1
  end
  redis.call('HSET', KEYS[1], unpack(args))
end
return #ARGV
