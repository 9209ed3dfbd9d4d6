-- start: mark entries as running, for the work of the job's current generation only (a
-- batch read before its job was deleted and queued again is refused with GONE before it is
-- sent). The caller owns the entries and knows their marks: each is written as given.
-- KEYS: [1] running, [2] meta
-- ARGV: [1] generation, then entry_id, mark pairs
-- Returns 1.
check_generation(KEYS[2], ARGV[1])
redis.call('HSET', KEYS[1], unpack(ARGV, 2))
return 1
