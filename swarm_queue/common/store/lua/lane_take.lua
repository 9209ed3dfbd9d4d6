-- lane_take: a drain loop takes the entries waiting in its endpoint's lane (agent turns whose
-- turn before that endpoint served: its engine holds their prefix), oldest first, claimed from
-- the lane to the loop's own consumer. Atomic, so two loops never take the same entry.
-- KEYS: [1] stream
-- ARGV: [1] group, [2] lane, [3] consumer, [4] count
-- Returns entry ID, payload, entry ID, payload... ('' for an entry gone from the stream).
local stream, group, lane, me = KEYS[1], ARGV[1], ARGV[2], ARGV[3]
if redis.call('EXISTS', stream) == 0 then return {} end
local page = redis.pcall('XPENDING', stream, group, '-', '+', tonumber(ARGV[4]), lane)
if page.err or #page == 0 then return {} end
local ids = {}
for i, e in ipairs(page) do ids[i] = e[1] end
return claimed_flat(redis.call('XCLAIM', stream, group, me, 0, unpack(ids)))
