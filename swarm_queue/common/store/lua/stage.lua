-- stage: record that a job's reduce now runs tree level `level`, with counts about how that
-- stage was built kept in the stage's own meta.
-- KEYS: [1] the job's meta, [2] the stage's meta
-- ARGV: [1] level, [2] the job's generation (GONE if another now), then field, value pairs for
--       the stage's meta
-- Returns 1.
local gone = generation_error(KEYS[1], ARGV[2])
if gone then return gone end
if #ARGV > 2 then redis.call('HSET', KEYS[2], unpack(ARGV, 3)) end
redis.call('HSET', KEYS[1], META.STAGE, ARGV[1])
return 1
