-- add: append one chunk of prompts, all or nothing. Refused if the job was cancelled, or if the
-- chunk does not start exactly where the stream ends (a resume from the wrong point). The digest
-- of the input up to the chunk's end is kept with the resume point, so that a resume can check
-- it goes on with the same input. A producer of a job deleted (or lost) meanwhile is refused
-- with GONE, even when the name has been taken again.
-- KEYS: [1] meta, [2] stream
-- ARGV: [1] first index, [2] input digest ('' for none), [3] generation, [4] '1' when the
--       prompts carry affinity keys (common/affinity.py), then per prompt in index order its
--       payload, and with [4] '1' its key ('' for none): a chunk of no key sends none of them.
-- Returns {1, prompts now queued}, {-1, 0} if cancelled, {-2, prompts queued} if misplaced.
local meta, stream = KEYS[1], KEYS[2]
local gone = generation_error(meta, ARGV[3])
if gone then return gone end
if redis.call('HEXISTS', meta, META.CANCELLED_S) == 1 then return {-1, 0} end
local have = tonumber(redis.call('HGET', meta, META.ENQUEUED) or '0')
local first = tonumber(ARGV[1])
if have ~= first then return {-2, have} end
local step = ARGV[4] == '1' and 2 or 1
local n = (#ARGV - 4) / step
for k = 1, n do
  local at = 5 + (k - 1) * step
  local payload, key = ARGV[at], step == 2 and ARGV[at + 1] or ''
  local id = string.format('0-%d', first + k)
  if key == '' then
    redis.call('XADD', stream, id, 'd', payload)
  else
    redis.call('XADD', stream, id, 'd', payload, 'a', key)
  end
end
redis.call('HSET', meta, META.ENQUEUED, first + n)
if ARGV[2] ~= '' then redis.call('HSET', meta, META.INPUT_DIGEST, ARGV[2]) end
return {1, first + n}
