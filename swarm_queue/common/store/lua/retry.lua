-- retry: queue prompts again: failed ones, or ones answered from the response cache (to ask an
-- endpoint instead). Drops their results, re-adds their original entries to the stream under
-- IDs `round-(index+1)` (greater than every earlier ID, same index: workers send such an entry
-- to an endpoint, never to the cache), moves the counters back, counts a revision of the job
-- (what tells a collector its complete file is out of date) and reopens the job. A prompt
-- below the eviction mark (its line in a file collected with --evict) is reopened: its new
-- entry ID is recorded, the one commit that may write it (see commit.lua). A prompt whose
-- entry is not kept (answered by an endpoint, or retried already) is skipped.
-- KEYS: [1] results, [2] meta, [3] stream, [4] failed, [5] cached, [6] reopened
-- ARGV: [1] round, [2] generation (GONE if the job is another now), then per prompt two:
--       index, and its failure kind or '+' for an answer from the cache
-- Returns how many were queued again.
local results, meta, stream, failed_h, cached_h = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5]
local reopened = KEYS[6]
local round, n, hits = ARGV[1], 0, 0
local gone = generation_error(meta, ARGV[2])
if gone then return gone end
local evicted = tonumber(redis.call('HGET', meta, META.EVICTED) or '0')
for b = 3, #ARGV, 2 do
  local idx, kind = ARGV[b], ARGV[b + 1]
  local kept = kind == '+' and cached_h or failed_h
  local payload = redis.call('HGET', kept, idx)
  if payload then
    local id = round .. '-' .. (tonumber(idx) + 1)
    redis.call('HDEL', results, idx)
    redis.call('HDEL', kept, idx)
    redis.call('XADD', stream, id, 'd', payload)
    if tonumber(idx) < evicted then redis.call('HSET', reopened, idx, id) end
    if kind == '+' then
      hits = hits + 1
    else
      redis.call('HINCRBY', meta, FAILED_KIND_PREFIX .. kind, -1)
    end
    n = n + 1
  end
end
if n > 0 then
  if n > hits then redis.call('HINCRBY', meta, META.FAILED, hits - n) end
  if hits > 0 then
    redis.call('HINCRBY', meta, META.DONE, -hits)
    redis.call('HINCRBY', meta, META.CACHE_HITS, -hits)
  end
  redis.call('HDEL', meta, META.FINISHED_S, META.CANCELLED_S)
  redis.call('HINCRBY', meta, META.REVISION, 1)
end
return n
