-- lane_steal: an endpoint with nothing else to do takes entries that have waited at least
-- min idle in other endpoints' lanes: their endpoint is busy, stuck or gone, and a turn served
-- elsewhere (its prefix computed again) beats a turn left waiting. Claimed to the loop's own
-- consumer, lane after lane. Entries of one affinity key go together: of the oldest entries
-- that waited (up to scan of a lane), the whole group of each key, oldest key first, so that a
-- prefix taken over is computed once on the taker, not once for each of its prompts.
-- KEYS: [1] stream
-- ARGV: [1] group, [2] own lane, [3] consumer, [4] count, [5] min idle (ms), [6] scan
-- Returns entry ID, payload, entry ID, payload... ('' for an entry gone from the stream).
local stream, group, own, me = KEYS[1], ARGV[1], ARGV[2], ARGV[3]
local need, idle, scan = tonumber(ARGV[4]), tonumber(ARGV[5]), tonumber(ARGV[6])
if redis.call('EXISTS', stream) == 0 then return {} end
local consumers = redis.pcall('XINFO', 'CONSUMERS', stream, group)
if consumers.err then return {} end

-- The affinity key of entry `id` ('' for none, or for an entry gone).
local function key_of(id)
  local e = redis.call('XRANGE', stream, id, id)[1]
  local fields = e and e[2] or {}
  for f = 1, #fields, 2 do
    if fields[f] == 'a' then return fields[f + 1] end
  end
  return ''
end

local ids = {}
for _, c in ipairs(consumers) do
  local info = {}
  for i = 1, #c, 2 do info[c[i]] = c[i + 1] end
  local name = info['name']
  if info['pending'] > 0 and name ~= own and string.sub(name, 1, #LANE_PREFIX) == LANE_PREFIX then
    local page = redis.call('XPENDING', stream, group, 'IDLE', idle, '-', '+', scan, name)
    local groups, order = {}, {}
    for _, e in ipairs(page) do
      local key = key_of(e[1])
      if key == '' then key = e[1] end  -- (no key: a group of its own)
      if not groups[key] then
        groups[key] = {}
        order[#order + 1] = key
      end
      local members = groups[key]
      members[#members + 1] = e[1]
    end
    for _, key in ipairs(order) do
      for _, id in ipairs(groups[key]) do
        if #ids >= need then break end
        ids[#ids + 1] = id
      end
      if #ids >= need then break end
    end
    if #ids >= need then break end
  end
end
if #ids == 0 then return {} end
return claimed_flat(redis.call('XCLAIM', stream, group, me, idle, unpack(ids)))
