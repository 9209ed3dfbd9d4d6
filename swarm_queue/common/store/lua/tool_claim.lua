-- tool_claim: the answer kept for a tool call, or else the call claimed for this asker (who
-- then queues it for the runners) unless another holds it. One step: a runner keeps its
-- answer and only then lets go of the claim, so an asker who finds neither can only be
-- before that answer's run, never between its answer and its claim (it would run twice).
-- An answer found is kept at least the hand-over time from now: while askers keep coming (agents
-- reaching the same call minutes apart on a loaded fleet), it is theirs, never run again.
-- KEYS: [1] answer, [2] claim
-- ARGV: [1] claim's time to live (ms), [2] the hand-over time (ms)
-- Returns the answer (bytes), or 1 (claimed now) or 0 (another holds it).
local answer = redis.call('GET', KEYS[1])
if answer then
  local ttl = redis.call('PTTL', KEYS[1])
  if ttl >= 0 and ttl < tonumber(ARGV[2]) then redis.call('PEXPIRE', KEYS[1], ARGV[2]) end
  return answer
end
if redis.call('SET', KEYS[2], '1', 'NX', 'PX', ARGV[1]) then return 1 end
return 0
