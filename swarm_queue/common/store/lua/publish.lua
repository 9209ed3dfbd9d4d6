-- publish: write a job's per-endpoint figures, unless the job is gone (deleted meanwhile: no
-- orphan key is left behind).
-- KEYS: [1] meta, [2] endpoints
-- ARGV: field, value, field, value...
-- Returns 1 if written, 0 if the job is gone.
if redis.call('EXISTS', KEYS[1]) == 0 then return 0 end
redis.call('HSET', KEYS[2], unpack(ARGV))
return 1
