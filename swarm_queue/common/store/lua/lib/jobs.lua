-- Shared by every script that writes into a job: whether the work in hand still belongs to
-- the job as it is now. A job deleted (or lost with a Redis restarted empty) and queued again
-- under its name is another generation; a commit, a release or a reduce step of work taken
-- from the old one must be refused, never written.

-- The error reply GONE (translated by the store into JobGoneError) to return at once, before
-- anything is written, unless `meta` is the meta of a live job of generation `gen` (then nil);
-- and the job's eviction mark (0: none). Returned, not raised: Redis 6.2 (the embedded
-- default's) cannot carry a raised error table, and its reply would lose the code.
-- `extra`: meta fields read in the same HMGET, returned third (their values from index 3).
local function generation_error(meta, gen, extra)
  local have = redis.call('HMGET', meta, META.GENERATION, META.EVICTED, unpack(extra or {}))
  local evicted = have[2] and tonumber(have[2]) or 0
  if have[1] == gen then return nil, evicted, have end
  return redis.error_reply('GONE ' .. meta .. ' is not of generation ' .. gen), evicted, have
end
