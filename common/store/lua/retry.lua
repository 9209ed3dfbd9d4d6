-- retry: queue failed prompts again. Drops their results, re-adds their original entries to the
-- stream under IDs `round-(index+1)` (greater than every earlier ID, same index), moves the
-- counters back and reopens the job. A prompt below the eviction mark is skipped: its line is
-- in a collected file, and no answer could reach it.
-- KEYS: [1] results, [2] meta, [3] stream, [4] failed
-- ARGV: [1] round, [2] generation (GONE if the job is another now), then per prompt two:
--       index, failure kind
-- Returns how many were queued again (a prompt with no kept entry is skipped).
local results, meta, stream, failed_h = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local round, n = ARGV[1], 0
check_generation(meta, ARGV[2])
local evicted = tonumber(redis.call('HGET', meta, META.EVICTED) or '0')
for b = 3, #ARGV, 2 do
  local idx, kind = ARGV[b], ARGV[b + 1]
  local payload = tonumber(idx) >= evicted and redis.call('HGET', failed_h, idx)
  if payload then
    redis.call('HDEL', results, idx)
    redis.call('HDEL', failed_h, idx)
    redis.call('XADD', stream, round .. '-' .. (tonumber(idx) + 1), 'd', payload)
    redis.call('HINCRBY', meta, FAILED_KIND_PREFIX .. kind, -1)
    n = n + 1
  end
end
if n > 0 then
  redis.call('HINCRBY', meta, META.FAILED, -n)
  redis.call('HDEL', meta, META.FINISHED_S, META.CANCELLED_S)
end
return n
