-- claim_mine: re-claim, for the calling consumer, those of the given entries it still owns.
-- Without an idle time this resets their idle time (a heartbeat); with one it marks them long
-- idle (a release: any worker's reclaim takes them at once) and takes back their `running`
-- marks, since handing work back is no death; unless its request was lost in the server (it
-- hung or died under it, ARGV[5] '1'): then the marks stay, a death as a worker's is. Entries another worker took over meanwhile are
-- left alone, so a slow worker never steals them back. Entries of another generation of the
-- job (deleted and queued again under its name, same entry IDs) are refused with GONE.
-- A release that gives entries back because the endpoint's answers could not be used strikes
-- each one (KEYS[4]): what tells, later, that an entry has been round enough endpoints. A
-- consumer strikes an entry once however often it gives it back (field `ID|consumer` marks
-- it): one endpoint that answers unusably and takes back what it gave back cannot fail an
-- entry alone. Every give-back is counted too (field `ID|n`): however the fleet hands it
-- round, an entry's tries are bounded. And the requests that carried it to the endpoints that
-- gave it back are added up (field `ID|t`, ARGV[6]): a line that fails at last says them all.
-- KEYS: [1] stream, [2] running, [3] meta, [4] (a release's strikes, if any) strikes
-- ARGV: [1] group, [2] consumer, [3] idle_ms ('' for a heartbeat), [4] generation, [5] '1' if
--       the marks stay (a lost request), [6] the requests that carried each entry here (with
--       KEYS[4]), then the entry IDs, sorted
-- Returns how many entries the consumer still owned.
local stream, running, group, consumer, idle = KEYS[1], KEYS[2], ARGV[1], ARGV[2], ARGV[3]
local gone = generation_error(KEYS[3], ARGV[4])
if gone then return gone end
local ids = still_held(stream, group, consumer, 7)
local lost = ARGV[5] == '1'
for i = 1, #ids, 500 do
  -- unpack() only expands as the last argument, so build the whole argument list first.
  local args = {'XCLAIM', stream, group, consumer, 0}
  for j = i, math.min(i + 499, #ids) do args[#args + 1] = ids[j] end
  if idle ~= '' then
    args[#args + 1] = 'IDLE'
    args[#args + 1] = idle
  end
  args[#args + 1] = 'JUSTID'
  redis.call(unpack(args))
end
if idle ~= '' then
  for _, id in ipairs(ids) do
    if not lost then unmark(running, id) end
    if KEYS[4] then
      redis.call('HINCRBY', KEYS[4], id .. '|n', 1)
      if tonumber(ARGV[6]) > 0 then redis.call('HINCRBY', KEYS[4], id .. '|t', ARGV[6]) end
      if redis.call('HSETNX', KEYS[4], id .. '|' .. consumer, 1) == 1 then
        redis.call('HINCRBY', KEYS[4], id, 1)
      end
    end
  end
end
return #ids
