-- copy: speculative copies for an endpoint with nothing else to do at a job's tail (MapReduce's
-- backup tasks). Only once the job is sealed (no entry will come any more: a pipeline step or
-- an agent's later turn is fed until the one before ends, and copying it meanwhile would run
-- most of it twice) and every entry has been delivered (none new is left to read): the oldest
-- entries in other consumers' hands, each copied once across the fleet, and only those held
-- for at least min idle (a batch held for less than a batch takes is not late: its copy
-- would most likely finish second). Nothing is claimed: the holder keeps its entry, and
-- whichever commit comes first wins.
-- KEYS: [1] stream, [2] copies (the set of entry IDs copied so far), [3] meta
-- ARGV: [1] group, [2] consumer, [3] count, [4] generation (GONE if the job is another now),
--       [5] min idle (ms; 0 when absent)
-- Returns entry ID, payload, entry ID, payload... (empty while new entries remain).
local stream, copies = KEYS[1], KEYS[2]
local group, me, count = ARGV[1], ARGV[2], tonumber(ARGV[3])
local idle = tonumber(ARGV[5] or '0')
local gone = generation_error(KEYS[3], ARGV[4])
if gone then return gone end
if redis.call('HEXISTS', KEYS[3], META.TOTAL) == 0 then return {} end
local info = group_info(stream, group)
local pending = info and info['pending'] or 0
if pending == 0 or any_undelivered(stream, info) then return {} end
local out, after, scanned = {}, '-', 0
while #out < 2 * count and scanned < 10000 do
  local page = redis.call('XPENDING', stream, group, 'IDLE', idle, after, '+', 500)
  if #page == 0 then break end
  -- One SMISMEMBER per page, not an SADD per entry: late in a tail nearly every entry held
  -- has been copied already, and an idle fleet asks again and again.
  local ids = {}
  for i, e in ipairs(page) do ids[i] = e[1] end
  local copied = redis.call('SMISMEMBER', copies, unpack(ids))
  for i, e in ipairs(page) do
    if e[2] ~= me and copied[i] == 0 then
      redis.call('SADD', copies, e[1])
      local got = redis.call('XRANGE', stream, e[1], e[1])
      if #got == 1 then
        local fields, payload = got[1][2], false
        for f = 1, #fields, 2 do
          if fields[f] == 'd' then payload = fields[f + 1] end
        end
        if payload then
          out[#out + 1] = e[1]
          out[#out + 1] = payload
        end
      end
      if #out >= 2 * count then break end
    end
  end
  scanned = scanned + #page
  after = '(' .. page[#page][1]
end
return out
