-- Shared by every script that writes into a job: whether the work in hand still belongs to
-- the job as it is now. A job deleted (or lost with a Redis restarted empty) and queued again
-- under its name is another generation; a commit, a release or a reduce step of work taken
-- from the old one must be refused, never written.

-- Refuse (with the error code GONE, translated by the store into JobGoneError) unless `meta`
-- is the meta of a live job of generation `gen`. A job created before generations were kept
-- has none: it matches the empty generation while its spec exists.
local function check_generation(meta, gen)
  local have = redis.call('HGET', meta, META.GENERATION)
  if have then
    if have == gen then return end
  elseif gen == '' and redis.call('HEXISTS', meta, META.SPEC) == 1 then
    return
  end
  error({err = 'GONE ' .. meta .. ' is not of generation ' .. gen})
end
