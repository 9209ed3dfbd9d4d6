-- outcomes: what a flow learnt of a workflow job's inputs (an agent pump, from a turn's
-- answers), written at once, into the job of the generation it read them from (a job deleted
-- and queued again under its name refuses them whole: its inputs are others): inputs' states
-- between steps, inputs now parked (waiting outside the fleet), inputs no longer parked, and
-- inputs' outcomes, each recorded once (a second outcome of an input is ignored) with its
-- state and any wait dropped and its finish appended to the job's `finished` stream (the
-- order inputs finished in, for who streams them).
-- KEYS: [1] outcomes, [2] states, [3] parked, [4] finished, [5] meta
-- ARGV: [1] generation, then three groups, each a count and that many input, value pairs:
--       states, waits, outcomes; then the inputs no longer parked.
-- Returns how many outcomes were new.
local gone = generation_error(KEYS[5], ARGV[1])
if gone then return gone end
local i = 2
local function pairs_of(hash, put)
  local n = tonumber(ARGV[i])
  for j = i + 1, i + 2 * n, 2 do put(hash, ARGV[j], ARGV[j + 1]) end
  i = i + 1 + 2 * n
end
-- An input already finished is neither given a state nor parked again: a pump that took a
-- step's answer again (its first taker died before acknowledging it) must not bring back an
-- input that has ended since.
local function hset(hash, field, value)
  if redis.call('HEXISTS', KEYS[1], field) == 0 then redis.call('HSET', hash, field, value) end
end
local new = 0
pairs_of(KEYS[2], hset)
pairs_of(KEYS[3], hset)
pairs_of(KEYS[1], function(done, input, outcome)
  if redis.call('HSETNX', done, input, outcome) == 1 then
    new = new + 1
    redis.call('XADD', KEYS[4], '*', 'a', input)
  end
  redis.call('HDEL', KEYS[2], input)
  redis.call('HDEL', KEYS[3], input)
end)
for j = i, #ARGV do redis.call('HDEL', KEYS[3], ARGV[j]) end
return new
