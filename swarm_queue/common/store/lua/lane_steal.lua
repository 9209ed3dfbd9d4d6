-- lane_steal: an endpoint with nothing else to do takes entries that have waited at least
-- min idle in other endpoints' lanes: their endpoint is busy, stuck or gone, and a turn served
-- elsewhere (its prefix computed again) beats a turn left waiting. Claimed to the loop's own
-- consumer, lane after lane. The affinity keys of the entries taken become the taker's (its
-- engine computes their prefix now: the key's later entries are handed to its lane).
-- KEYS: [1] stream, [2] owners
-- ARGV: [1] group, [2] own lane, [3] consumer, [4] count, [5] min idle (ms)
-- Returns entry ID, payload, entry ID, payload... ('' for an entry gone from the stream).
local stream, group, own, me = KEYS[1], ARGV[1], ARGV[2], ARGV[3]
local need, idle = tonumber(ARGV[4]), tonumber(ARGV[5])
if redis.call('EXISTS', stream) == 0 then return {} end
local consumers = redis.pcall('XINFO', 'CONSUMERS', stream, group)
if consumers.err then return {} end
local ids = {}
for _, c in ipairs(consumers) do
  local info = {}
  for i = 1, #c, 2 do info[c[i]] = c[i + 1] end
  local name = info['name']
  if info['pending'] > 0 and name ~= own and string.sub(name, 1, #LANE_PREFIX) == LANE_PREFIX then
    local page = redis.call('XPENDING', stream, group, 'IDLE', idle, '-', '+', need - #ids, name)
    for _, e in ipairs(page) do ids[#ids + 1] = e[1] end
    if #ids >= need then break end
  end
end
if #ids == 0 then return {} end
local claimed = redis.call('XCLAIM', stream, group, me, idle, unpack(ids))
for _, e in ipairs(claimed) do
  local fields = e and e[2] or {}
  for f = 1, #fields, 2 do
    if fields[f] == 'a' then redis.call('HSET', KEYS[2], fields[f + 1], own) end
  end
end
return claimed_flat(claimed)
