-- agents: what an agent pump learnt from a turn's answers, written at once, into the job of
-- the generation it read them from (a job deleted and queued again under its name refuses
-- them whole: its agents are others): agents' states between turns, agents now waiting on
-- tool calls, agents no longer waiting, and agents' results, each recorded once (a second
-- result of an agent is ignored) with its state and any wait dropped and its finish appended
-- to the job's `finished` stream (the order agents finished in, for who streams them).
-- KEYS: [1] done, [2] agents (states), [3] waiting, [4] finished, [5] meta
-- ARGV: [1] generation, then three groups, each a count and that many agent, value pairs:
--       states, waits, results; then the agents no longer waiting.
-- Returns how many results were new.
local gone = generation_error(KEYS[5], ARGV[1])
if gone then return gone end
local i = 2
local function pairs_of(hash, put)
  local n = tonumber(ARGV[i])
  for j = i + 1, i + 2 * n, 2 do put(hash, ARGV[j], ARGV[j + 1]) end
  i = i + 1 + 2 * n
end
-- An agent already finished is neither given a state nor parked again: a pump that took a
-- turn's answer again (its first taker died before acknowledging it) must not bring back
-- an agent that has ended since.
local function hset(hash, field, value)
  if redis.call('HEXISTS', KEYS[1], field) == 0 then redis.call('HSET', hash, field, value) end
end
local new = 0
pairs_of(KEYS[2], hset)
pairs_of(KEYS[3], hset)
pairs_of(KEYS[1], function(done, agent, result)
  if redis.call('HSETNX', done, agent, result) == 1 then
    new = new + 1
    redis.call('XADD', KEYS[4], '*', 'a', agent)
  end
  redis.call('HDEL', KEYS[2], agent)
  redis.call('HDEL', KEYS[3], agent)
end)
for j = i, #ARGV do redis.call('HDEL', KEYS[3], ARGV[j]) end
return new
