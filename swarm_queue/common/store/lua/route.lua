-- route: entries a drain loop has just read, each of an affinity key (common/affinity.py), go
-- to the lane of the endpoint that took the key's first entry (its engine holds the prefix):
-- claimed to that lane, where its endpoint takes them first and any other only late. An entry
-- whose key has no owner yet makes the reader its owner, and stays; so does one of its own.
-- KEYS: [1] stream, [2] owners
-- ARGV: [1] group, [2] the reader's lane, [3] the reader's consumer, then pairs: entry ID, key
-- Returns the IDs handed to other lanes.
local stream, owners, group, mine = KEYS[1], KEYS[2], ARGV[1], ARGV[2]
local handed = {}
for i = 4, #ARGV, 2 do
  local id, key = ARGV[i], ARGV[i + 1]
  local owner = redis.call('HGET', owners, key)
  if not owner then
    redis.call('HSET', owners, key, mine)
  elseif owner ~= mine then
    redis.call('XCLAIM', stream, group, owner, 0, id, 'JUSTID')
    handed[#handed + 1] = id
  end
end
return handed
