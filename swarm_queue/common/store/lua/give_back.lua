-- give_back: a drain loop hands entries it holds but whose requests it cut short before they
-- ran (an agent's turns waiting inside a busy engine) to the open lane, where any endpoint with
-- nothing else to do takes them at once (lane_steal): marked idle for `idle` ms, the lane wait,
-- and no longer, so orphan reclaims (which wait the claim idle time) leave them to the lanes.
-- Their running marks are taken back: handing work on is no death. Entries another worker took
-- over meanwhile are left alone; entries of another generation of the job are refused (GONE).
-- KEYS: [1] stream, [2] running, [3] meta
-- ARGV: [1] group, [2] consumer, [3] open lane, [4] idle ms, [5] generation, then the entry
--       IDs, sorted
-- Returns how many entries were handed on.
local stream, running, group, consumer = KEYS[1], KEYS[2], ARGV[1], ARGV[2]
local gone = generation_error(KEYS[3], ARGV[5])
if gone then return gone end
local ids = still_held(stream, group, consumer, 6)
for i = 1, #ids, 500 do
  local args = {'XCLAIM', stream, group, ARGV[3], 0}
  for j = i, math.min(i + 499, #ids) do args[#args + 1] = ids[j] end
  args[#args + 1] = 'IDLE'
  args[#args + 1] = ARGV[4]
  args[#args + 1] = 'JUSTID'
  redis.call(unpack(args))
end
for _, id in ipairs(ids) do unmark(running, id) end
return #ids
