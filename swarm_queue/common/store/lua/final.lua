-- final: store a job's reduce output once, and mark its reduce finished.
-- KEYS: [1] final, [2] meta
-- ARGV: [1] the encoded output, [2] the job's generation (GONE if another now)
-- Returns 1 if written, 0 if an output was there already.
local gone = generation_error(KEYS[2], ARGV[2])
if gone then return gone end
local written = redis.call('SET', KEYS[1], ARGV[1], 'NX')
redis.call('HSETNX', KEYS[2], META.REDUCED_S, now_s())
if written then return 1 end
return 0
