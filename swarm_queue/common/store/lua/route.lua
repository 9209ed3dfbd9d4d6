-- route: entries a drain loop has just read, each of an affinity key (common/affinity.py) that
-- hashes to another endpoint's lane, handed to that lane (claimed to it): its endpoint, whose
-- engine computes the key's prefix, takes them first, any other only late.
-- KEYS: [1] stream
-- ARGV: [1] group, then pairs: entry ID, lane
-- Returns how many entries were handed.
local stream, group = KEYS[1], ARGV[1]
for i = 2, #ARGV, 2 do
  redis.call('XCLAIM', stream, group, ARGV[i + 1], 0, ARGV[i], 'JUSTID')
end
return #ARGV / 2
