-- evict: delete the results of indices [start, end) once a collector's output holds them
-- durably, but a failure's: its result and its kept entry stay for swarm-retry (a retried
-- prompt's answer then reaches the file when the collector brings it up to date), and raise
-- the job's eviction mark to `end`. A collector evicts in input order, so the mark says every
-- index below it has left Redis for good but the failures: a late commit (a speculative copy,
-- a redelivery after a Redis restart lost an ack) is neither stored nor counted there.
-- Refused with GONE for another generation of the job.
-- KEYS: [1] results, [2] meta, [3] failed
-- ARGV: [1] generation, [2] start, [3] end
-- Returns the eviction mark.
local results, meta, failed_h = KEYS[1], KEYS[2], KEYS[3]
local gone, _, known = generation_error(meta, ARGV[1], {META.CHUNK, META.PACKED})
if gone then return gone end
local lo, hi = tonumber(ARGV[2]), tonumber(ARGV[3])
-- A chunk's field (a job that packs its chunks: common/store/resultfields.py) goes once every
-- index of it is below `end`; it never holds a failure. One below `start` went before.
local chunk = tonumber(known[3] or '1') or 1
if chunk > 1 and known[4] == '1' then
  local fields = {}
  for first = lo - lo % chunk, hi - chunk, chunk do
    fields[#fields + 1] = RESULT_CHUNK_PREFIX .. first
    if #fields == 5000 then
      redis.call('HDEL', results, unpack(fields))
      fields = {}
    end
  end
  if #fields > 0 then redis.call('HDEL', results, unpack(fields)) end
end
for first = lo, hi - 1, 5000 do
  local fields = {}
  for i = first, math.min(first + 4999, hi - 1) do fields[#fields + 1] = tostring(i) end
  local failed = redis.call('HMGET', failed_h, unpack(fields))
  local answered = {}
  for f = 1, #fields do
    if not failed[f] then answered[#answered + 1] = fields[f] end
  end
  if #answered > 0 then redis.call('HDEL', results, unpack(answered)) end
end
local mark = tonumber(redis.call('HGET', meta, META.EVICTED) or '0')
if hi > mark then
  redis.call('HSET', meta, META.EVICTED, hi)
  mark = hi
end
return mark
