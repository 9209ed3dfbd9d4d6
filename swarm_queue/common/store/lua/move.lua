-- move: a pipeline step's answers, taken from its `landed` stream, queued into the next step
-- (or recorded as dropped by the step's filter), and acknowledged there: all or nothing. Each
-- input index moves once: one already fed or dropped refuses the whole call (another pump
-- moved it meanwhile: the caller reads again). Items are numbered on from the next step's
-- `enqueued`, as the caller numbered them; a call from another starting point is refused. A
-- next step sealed meanwhile (a retried answer arriving late) is opened again: its pump seals
-- it once more when the step before is finished. An item marked for a lane ('@' and the
-- lane) is handed to that lane as it is queued (read by the lane consumer: see lanes.py), as
-- long as no entry is left undelivered before it (the read takes the oldest): else it is
-- queued for any endpoint, like the ones after it in this call; marked not running there (0:
-- an entry pending with no mark counts as running once: common/store/entries.py's deaths).
-- KEYS: [1] next meta, [2] next stream, [3] next fed, [4] next dropped, [5] landed, [6] next
--       running
-- ARGV: [1] next generation, [2] first index, [3] landed's group, [4] the next stream's group,
--       [5] n landed IDs to acknowledge, then those IDs, then per input index three: origin,
--       '+' (queued), '@' and a lane (queued for that lane) or '-' (dropped), payload or reason
-- Returns {1, queued now}, {-2, queued} if misplaced, {-3, origin} if one moved already.
local meta, stream, fed, dropped, landed = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5]
local gone = generation_error(meta, ARGV[1])
if gone then return gone end
local have = tonumber(redis.call('HGET', meta, META.ENQUEUED) or '0')
if have ~= tonumber(ARGV[2]) then return {-2, have} end
local n = tonumber(ARGV[5])
local first = 6 + n
for t = first, #ARGV, 3 do
  local origin = ARGV[t]
  if redis.call('HEXISTS', fed, origin) == 1 or redis.call('HEXISTS', dropped, origin) == 1 then
    return {-3, tonumber(origin)}
  end
end
local handing = false
for t = first, #ARGV, 3 do
  if string.sub(ARGV[t + 1], 1, 1) == '@' then
    local info = group_info(stream, ARGV[4])
    handing = info ~= nil and not any_undelivered(stream, info)
    break
  end
end
local queued = 0
for t = first, #ARGV, 3 do
  local mark = ARGV[t + 1]
  if mark ~= '-' then
    local id = string.format('0-%d', have + 1)
    redis.call('XADD', stream, id, 'd', ARGV[t + 2])
    if handing and mark ~= '+' then
      redis.call('XREADGROUP', 'GROUP', ARGV[4], string.sub(mark, 2), 'COUNT', 1,
        'STREAMS', stream, '>')
      redis.call('HSET', KEYS[6], id, 0)
    else
      handing = false  -- left undelivered: a later read would take it, not its own entry
    end
    redis.call('HSET', fed, ARGV[t], have)
    have = have + 1
    queued = queued + 1
  else
    redis.call('HSET', dropped, ARGV[t], ARGV[t + 2])
  end
end
if queued > 0 then
  redis.call('HSET', meta, META.ENQUEUED, have)
  if redis.call('HEXISTS', meta, META.TOTAL) == 1 then
    redis.call('HDEL', meta, META.TOTAL, META.SEALED_S, META.FINISHED_S)
  end
end
if n > 0 then
  local ids = {}
  for i = 6, 5 + n do ids[#ids + 1] = ARGV[i] end
  redis.call('XACK', landed, ARGV[3], unpack(ids))
  redis.call('XDEL', landed, unpack(ids))
end
return {1, have}
