-- start: mark entries as running. Their commit or release takes the mark back, so a mark still
-- there when an entry is taken again is a worker that died running it.
-- KEYS: [1] running
-- ARGV: the entry IDs
-- Returns how many were marked.
for i = 1, #ARGV do redis.call('HINCRBY', KEYS[1], ARGV[i], 1) end
return #ARGV
