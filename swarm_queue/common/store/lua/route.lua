-- route: entries a drain loop has just read, each of an affinity key (common/affinity.py), go
-- to the lane of the endpoint the key was given to: its engine computes the key's prefix, and
-- takes the entries first (any other endpoint only late). A key not given yet, or given to a
-- lane no longer live, is given to the live lane holding the fewest of the job's keys (the
-- reader's own on a tie), so each engine gets its share. An entry for the reader's own lane
-- stays with it; the others are claimed to their lanes, marked not running (0: an entry
-- pending with no mark counts as running once: common/store/entries.py's deaths).
-- KEYS: [1] stream, [2] owners, [3] running
-- ARGV: [1] group, [2] the reader's lane, [3] n, then the n live lanes, then pairs: entry ID,
--       key
-- Returns the IDs handed to other lanes.
local stream, owners, group, mine = KEYS[1], KEYS[2], ARGV[1], ARGV[2]
local n = tonumber(ARGV[3])
local live, count, order = {}, {}, {}
for i = 4, 3 + n do
  live[ARGV[i]] = true
  order[#order + 1] = ARGV[i]
  count[ARGV[i]] = tonumber(redis.call('HGET', owners, '#' .. ARGV[i]) or '0')
end
local handed = {}
for i = 4 + n, #ARGV, 2 do
  local id, key = ARGV[i], ARGV[i + 1]
  local owner = redis.call('HGET', owners, key)
  if not owner or not live[owner] then
    owner = live[mine] and mine or nil
    for _, lane in ipairs(order) do
      if owner == nil or count[lane] < count[owner] then owner = lane end
    end
    if owner == nil then owner = mine end
    redis.call('HSET', owners, key, owner)
    count[owner] = (count[owner] or 0) + 1
    redis.call('HINCRBY', owners, '#' .. owner, 1)
  end
  if owner ~= mine then
    redis.call('XCLAIM', stream, group, owner, 0, id, 'JUSTID')
    redis.call('HSET', KEYS[3], id, 0)
    handed[#handed + 1] = id
  end
end
return handed
