-- add: append prompts, all or nothing. Refused if the job was cancelled, or if the prompts do
-- not start exactly where the stream ends (a resume from the wrong point). The digest of the
-- input up to the last of them is kept with the resume point, so that a resume can check it
-- goes on with the same input. A producer of a job deleted (or lost) meanwhile is refused
-- with GONE, even when the name has been taken again. An entry may hold a chunk of
-- consecutive prompts (common/store/entries.py): its ID is its first prompt's, and its size,
-- where it is not the job's chunk (its last, one cut by an affinity key), goes to KEYS[3],
-- where a commit learns when the whole chunk is answered.
-- A shard of a job spread over several (common/shards.py) holds blocks of the input with the
-- other shards' between them: its prompts go on from where its last block ended ([6]), its
-- ENQUEUED counts its own, and NEXT keeps the index after them.
-- KEYS: [1] meta, [2] stream, [3] chunks
-- ARGV: [1] first index, [2] input digest ('' for none), [3] generation, [4] '1' when the
--       entries carry affinity keys (common/affinity.py), [5] the job's chunk when they carry
--       their sizes ('' else), [6] a shard's: the index after its prompts before ('' else),
--       then per entry in index order its payload, with [4] '1' its key ('' for none), with
--       [5] how many prompts it holds (else one each).
-- Returns {1, prompts now queued}, {-1, 0} if cancelled, {-2, prompts queued} if misplaced.
local meta, stream = KEYS[1], KEYS[2]
local gone = generation_error(meta, ARGV[3])
if gone then return gone end
if redis.call('HEXISTS', meta, META.CANCELLED_S) == 1 then return {-1, 0} end
local have = tonumber(redis.call('HGET', meta, META.ENQUEUED) or '0')
local first, after = tonumber(ARGV[1]), tonumber(ARGV[6])
local ended = have
if after then ended = tonumber(redis.call('HGET', meta, META.NEXT) or '0') end
if ended ~= (after or first) then return {-2, ended} end
local keyed, chunk = ARGV[4] == '1', tonumber(ARGV[5])
local sized = chunk ~= nil
local step = 1 + (keyed and 1 or 0) + (sized and 1 or 0)
local at, sizes = first, {}
for b = 7, #ARGV, step do
  local payload, key = ARGV[b], keyed and ARGV[b + 1] or ''
  local size = sized and tonumber(ARGV[b + step - 1]) or 1
  local id = string.format('0-%d', at + 1)
  if key == '' then
    redis.call('XADD', stream, id, 'd', payload)
  else
    redis.call('XADD', stream, id, 'd', payload, 'a', key)
  end
  if sized and size ~= chunk then
    sizes[#sizes + 1] = id
    sizes[#sizes + 1] = size
  end
  at = at + size
end
if #sizes > 0 then redis.call('HSET', KEYS[3], unpack(sizes)) end
if after then
  redis.call('HSET', meta, META.ENQUEUED, have + at - first, META.NEXT, at)
else
  redis.call('HSET', meta, META.ENQUEUED, at)
end
if ARGV[2] ~= '' then
  redis.call('HSET', meta, META.INPUT_DIGEST, ARGV[2])
elseif after then  -- (a shard's block that ends before the digest's prompt: no digest here)
  redis.call('HDEL', meta, META.INPUT_DIGEST)
end
return {1, at}
