-- backlog: what of a job the workers still have to do, from the stream itself: entries
-- delivered and not acknowledged (pending: in workers' hands, or waiting in an endpoint's
-- lane), whether any was never delivered, and how many of the pending wait in lanes (queued
-- for an endpoint, in no worker's hands yet), and how many were released (handed back by an
-- endpoint that gave them up: idle at least the release mark, in no worker's hands either until
-- one takes them). (The stream's length says none of this: acknowledged entries stay in it
-- until its head is trimmed.)
-- KEYS: [1] stream
-- ARGV: [1] group, [2] '1' to count the pending in lanes and released (a status; not whether
--       work is left, which idle workers ask often), [3] the release mark's idle time (ms)
-- Returns {pending entries, 1 if any entry was never delivered else 0, of the pending: in lanes,
-- released (both 0 when not asked)}.
local stream, group = KEYS[1], ARGV[1]
local info = group_info(stream, group)
local pending, in_lanes, released = info and info['pending'] or 0, 0, 0
if pending > 0 and ARGV[2] == '1' then
  for _, c in ipairs(redis.call('XPENDING', stream, group)[4] or {}) do
    if string.sub(c[1], 1, #LANE_PREFIX) == LANE_PREFIX then in_lanes = in_lanes + tonumber(c[2]) end
  end
  -- (counted up to 100,000: a status's figure, never a scan of a whole backlog)
  local idle = redis.call('XPENDING', stream, group, 'IDLE', ARGV[3], '-', '+', 100000)
  for _, e in ipairs(idle) do
    if string.sub(e[2], 1, #LANE_PREFIX) ~= LANE_PREFIX then released = released + 1 end
  end
end
return {pending, any_undelivered(stream, info) and 1 or 0, in_lanes, released}
