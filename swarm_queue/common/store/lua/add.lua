-- add: append one chunk of prompts, all or nothing. Refused if the job was cancelled, or if the
-- chunk does not start exactly where the stream ends (a resume from the wrong point). The digest
-- of the input up to the chunk's end is kept with the resume point, so that a resume can check
-- it goes on with the same input. A producer of a job deleted (or lost) meanwhile is refused
-- with GONE, even when the name has been taken again.
-- KEYS: [1] meta, [2] stream
-- ARGV: [1] first index, [2] input digest ('' for none), [3] generation, then the payloads in
--       index order
-- Returns {1, prompts now queued}, {-1, 0} if cancelled, {-2, prompts queued} if misplaced.
local meta, stream = KEYS[1], KEYS[2]
local gone = generation_error(meta, ARGV[3])
if gone then return gone end
if redis.call('HEXISTS', meta, META.CANCELLED_S) == 1 then return {-1, 0} end
local have = tonumber(redis.call('HGET', meta, META.ENQUEUED) or '0')
local first = tonumber(ARGV[1])
if have ~= first then return {-2, have} end
for i = 4, #ARGV do
  redis.call('XADD', stream, string.format('0-%d', first + i - 3), 'd', ARGV[i])
end
redis.call('HSET', meta, META.ENQUEUED, first + #ARGV - 3)
if ARGV[2] ~= '' then redis.call('HSET', meta, META.INPUT_DIGEST, ARGV[2]) end
return {1, first + #ARGV - 3}
