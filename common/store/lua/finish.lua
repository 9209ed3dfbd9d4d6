-- finish: record agents' results, each once (a second result of an agent is ignored), drop
-- their state and any wait, and append each newly finished agent to the job's `finished`
-- stream: the order agents finished in, for who streams them as they end.
-- KEYS: [1] done, [2] agents (states), [3] waiting, [4] finished
-- ARGV: agent, result blob, agent, result blob...
-- Returns how many results were new.
local new = 0
for i = 1, #ARGV, 2 do
  local agent = ARGV[i]
  if redis.call('HSETNX', KEYS[1], agent, ARGV[i + 1]) == 1 then
    new = new + 1
    redis.call('XADD', KEYS[4], '*', 'a', agent)
  end
  redis.call('HDEL', KEYS[2], agent)
  redis.call('HDEL', KEYS[3], agent)
end
return new
