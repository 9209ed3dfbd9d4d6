-- stage: record that a job's reduce now runs tree level `level`, with counts about how that
-- stage was built kept in the stage's own meta.
-- KEYS: [1] the job's meta, [2] the stage's meta
-- ARGV: [1] level, then field, value pairs for the stage's meta
-- Returns 1.
if #ARGV > 1 then redis.call('HSET', KEYS[2], unpack(ARGV, 2)) end
redis.call('HSET', KEYS[1], META.STAGE, ARGV[1])
return 1
