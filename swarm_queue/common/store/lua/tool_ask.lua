-- tool_ask: the answer kept for a tool call, or else the call queued for the tool's runners
-- and claimed for its entry (its ID), unless it is queued or running already (then its claim
-- is renewed: who waits on a call asks again now and then). One step: a runner keeps
-- its answer and only then lets go of the claim, so an asker who finds neither can only be
-- before that answer's run, never between its answer and its claim (it would run twice); and
-- no call is ever claimed without its entry queued (seen with a queue beside Redis: agents
-- parked for good on a claim whose try was lost to a Redis restart).
-- An answer found is kept at least the hand-over time from now: while askers keep coming (agents
-- reaching the same call minutes apart on a loaded fleet), it is theirs, never run again.
-- KEYS: [1] answer, [2] claim, [3] the tool's calls (stream)
-- ARGV: [1] claim's time to live (ms), [2] the hand-over time (ms), [3] group, [4] the
--       call's key, [5] its arguments
-- Returns the answer (bytes), or 1 (queued now) or 0 (queued or running already).
local answer = redis.call('GET', KEYS[1])
if answer then
  local ttl = redis.call('PTTL', KEYS[1])
  if ttl >= 0 and ttl < tonumber(ARGV[2]) then redis.call('PEXPIRE', KEYS[1], ARGV[2]) end
  return answer
end
local held = redis.call('GET', KEYS[2])
if held and #redis.call('XRANGE', KEYS[3], held, held) == 1 then
  redis.call('PEXPIRE', KEYS[2], ARGV[1])  -- its entry waits or runs: the claim renewed
  return 0
end
-- No claim, or one whose entry is gone (its stream deleted, a Redis restarted without it).
if redis.call('EXISTS', KEYS[3]) == 0 then
  redis.call('XGROUP', 'CREATE', KEYS[3], ARGV[3], '0', 'MKSTREAM')
end
local id = redis.call('XADD', KEYS[3], '*', 'k', ARGV[4], 'a', ARGV[5])
redis.call('SET', KEYS[2], id, 'PX', ARGV[1])
return 1
