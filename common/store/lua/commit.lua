-- commit: the worker's atomic "write results + ack". First write wins (HSETNX): counters move
-- only for new results, so a redelivered or speculative copy changes nothing. A failure keeps
-- its original entry (for swarm-retry) and counts under its kind. Acknowledged entries leave
-- the stream and their `running` marks go with them. The last result marks the job finished.
-- KEYS: [1] results, [2] meta, [3] stream, [4] failed, [5] running
-- ARGV: [1] group, [2] now_s, [3] prompt_tokens, [4] completion_tokens, then per entry five:
--       entry_id, index, result blob, failure kind ('' on success), original entry payload
-- Returns {new results done, new results failed}.
local results, meta, stream, failed_h, running = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5]
local group, now = ARGV[1], ARGV[2]
local done, failed, ids = 0, 0, {}
for b = 5, #ARGV, 5 do
  ids[#ids + 1] = ARGV[b]
  if redis.call('HSETNX', results, ARGV[b + 1], ARGV[b + 2]) == 1 then
    local kind = ARGV[b + 3]
    if kind == '' then
      done = done + 1
    else
      failed = failed + 1
      redis.call('HINCRBY', meta, FAILED_KIND_PREFIX .. kind, 1)
      redis.call('HSET', failed_h, ARGV[b + 1], ARGV[b + 4])
    end
  end
end
for i = 1, #ids, 500 do
  local chunk = {unpack(ids, i, math.min(i + 499, #ids))}
  redis.call('XACK', stream, group, unpack(chunk))
  redis.call('XDEL', stream, unpack(chunk))
  redis.call('HDEL', running, unpack(chunk))
end
if tonumber(ARGV[3]) > 0 then redis.call('HINCRBY', meta, META.PROMPT_TOKENS, ARGV[3]) end
if tonumber(ARGV[4]) > 0 then redis.call('HINCRBY', meta, META.COMPLETION_TOKENS, ARGV[4]) end
if done + failed > 0 then
  if done > 0 then redis.call('HINCRBY', meta, META.DONE, done) end
  if failed > 0 then redis.call('HINCRBY', meta, META.FAILED, failed) end
  redis.call('HSETNX', meta, META.FIRST_RESULT_S, now)
  redis.call('HSET', meta, META.LAST_RESULT_S, now)
  local total = redis.call('HGET', meta, META.TOTAL)
  if total then
    local d = tonumber(redis.call('HGET', meta, META.DONE) or '0')
    local f = tonumber(redis.call('HGET', meta, META.FAILED) or '0')
    if d + f >= tonumber(total) then redis.call('HSETNX', meta, META.FINISHED_S, now) end
  end
end
return {done, failed}
