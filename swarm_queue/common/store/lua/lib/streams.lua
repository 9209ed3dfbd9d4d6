-- Shared by every script: how far a job's consumer group has read its stream, and trimming
-- what it has finished.

-- The group's XINFO GROUPS fields ('pending', 'last-delivered-id'...), or nil when the group
-- (or the stream) does not exist. O(1), where XPENDING's summary walks every consumer.
local function group_info(stream, group)
  if redis.call('EXISTS', stream) == 0 then return nil end
  for _, g in ipairs(redis.call('XINFO', 'GROUPS', stream)) do
    local info = {}
    for i = 1, #g, 2 do info[g[i]] = g[i + 1] end
    if info['name'] == group then return info end
  end
  return nil
end

-- The group's last delivered entry ID, or nil when the group (or stream) does not exist.
local function last_delivered(stream, group)
  local info = group_info(stream, group)
  return info and info['last-delivered-id']
end

-- Whether the stream holds entries never delivered to the group (XRANGE past its last read);
-- `info` is the group's group_info (nil: no group, so every entry is undelivered).
local function any_undelivered(stream, info)
  if not info then return redis.call('XLEN', stream) > 0 end
  return #redis.call('XRANGE', stream, '(' .. info['last-delivered-id'], '+', 'COUNT', 1) > 0
end

-- Trim the acknowledged head of the stream: every entry before the oldest still pending (or,
-- with none pending, every entry delivered) is acknowledged. One XTRIM instead of an XDEL per
-- entry: deleting entries one by one cost Redis more than the rest of a commit together.
local function trim_acked(stream, group)
  local first = redis.call('XPENDING', stream, group, '-', '+', 1)
  local floor
  if #first > 0 then
    floor = first[1][1]
  else
    local last = last_delivered(stream, group)
    if not last then return end
    local ms, seq = string.match(last, '^(%d+)-(%d+)$')
    floor = ms .. '-' .. string.format('%d', tonumber(seq) + 1)
  end
  redis.call('XTRIM', stream, 'MINID', floor)
end

-- A stream entry's field `name` (false where it has none), from its reply {ID, {name,
-- value...}}: read in place, with no table of its fields made (a read's every entry).
local function entry_field(e, name)
  local fields = e[2] or {}
  for f = 1, #fields, 2 do
    if fields[f] == name then return fields[f + 1] end
  end
  return false
end

-- An XCLAIM reply as entry ID, payload, entry ID, payload... ('' where the entry is gone: a
-- Redis before 7 answers nil for it).
local function claimed_flat(reply)
  local out = {}
  for _, e in ipairs(reply) do
    if e then
      out[#out + 1] = e[1]
      out[#out + 1] = entry_field(e, 'd') or ''
    end
  end
  return out
end

-- The IDs among ARGV[first..] (sorted) still pending to `consumer` in `stream`'s `group`: the
-- entries a worker may still hand back, refresh or hand on (another may have taken the rest).
local function still_held(stream, group, consumer, first)
  local wanted = {}
  for i = first, #ARGV do wanted[ARGV[i]] = true end
  local pending = redis.call('XPENDING', stream, group, ARGV[first], ARGV[#ARGV], 100000, consumer)
  local ids = {}
  for _, e in ipairs(pending) do
    if wanted[e[1]] then ids[#ids + 1] = e[1] end
  end
  return ids
end

-- A run of entry `id` that ended with no death (handed back, handed on): its mark one less,
-- kept at 0 (an entry pending with no mark counts as running once: its first delivery, read
-- by a plain XREADGROUP, writes none; common/store/entries.py's deaths).
local function unmark(running, id)
  local n = tonumber(redis.call('HGET', running, id) or '1') - 1
  redis.call('HSET', running, id, n > 0 and n or 0)
end
