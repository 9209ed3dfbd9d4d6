-- seal: record the job's total once all its input is queued, and finish the job if its results
-- are all in already (a rerun of swarm-enqueue on a job the workers completed meanwhile).
-- KEYS: [1] meta
-- ARGV: [1] total, [2] generation (GONE if the job is another now)
-- Returns {1, total}, or {0, the total sealed before} when it differs.
local meta = KEYS[1]
local total, now = ARGV[1], now_s()
local gone = generation_error(meta, ARGV[2])
if gone then return gone end
local old = redis.call('HGET', meta, META.TOTAL)
if old and old ~= total then return {0, old} end
redis.call('HSET', meta, META.TOTAL, total)
redis.call('HSETNX', meta, META.SEALED_S, now)
local d = tonumber(redis.call('HGET', meta, META.DONE) or '0')
local f = tonumber(redis.call('HGET', meta, META.FAILED) or '0')
if d + f >= tonumber(total) then redis.call('HSETNX', meta, META.FINISHED_S, now) end
return {1, total}
