-- create: register a job, or find the one registered under its name. The spec and the job's
-- generation are written together, so no reader ever sees a spec without its generation.
-- KEYS: [1] meta
-- ARGV: [1] the encoded spec (its generation inside), [2] generation, [3] reduce kind ('': none),
--       [4] its chunk (prompts an entry), [5] the shards it is spread over (common/shards.py)
-- Returns {1, the spec} when created, {0, the stored spec} when the job existed.
local meta = KEYS[1]
if redis.call('HSETNX', meta, META.SPEC, ARGV[1]) == 0 then
  return {0, redis.call('HGET', meta, META.SPEC)}
end
redis.call(
  'HSET', meta, META.GENERATION, ARGV[2], META.CHUNK, ARGV[4], META.PARTIAL, '0', META.PACKED, '1'
)
if ARGV[3] ~= '' then redis.call('HSET', meta, META.REDUCE, ARGV[3]) end
if ARGV[5] ~= '1' then redis.call('HSET', meta, META.SHARDS, ARGV[5]) end
return {1, ARGV[1]}
