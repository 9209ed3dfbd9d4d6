-- start: mark entries as running, for the work of the job's current generation only (a
-- batch read before its job was deleted and queued again is refused with GONE before it is
-- sent). The caller owns the entries and knows their marks: each is written as given.
-- KEYS: [1] running, [2] meta
-- ARGV: [1] generation, then entry_id, mark pairs
-- Returns 1.
local gone = generation_error(KEYS[2], ARGV[1])
if gone then return gone end
-- Clearing the first mark first is no change (it is set next) but makes this script's first
-- write one that a Redis over its maxmemory allows (HDEL never grows memory): a full Redis
-- still lets batches start, and their commits free it (see commit.lua).
redis.call('HDEL', KEYS[1], ARGV[2])
redis.call('HSET', KEYS[1], unpack(ARGV, 2))
return 1
