-- take: a slot's read of new entries that also tells whether they run now: when the job is of
-- the taker's generation, the entries without an affinity key are running from their read
-- (an entry pending with no mark counts as running once, so nothing is written for them; no
-- start.lua before their request: one call a batch instead of two). Else the start before
-- sending refuses the batch, as for any read, and they are marked 0 (not running), as an
-- affinity key's entry always is (it may go to another endpoint's lane, and is marked by its
-- start where it runs). A worker that dies between this read and its request counts as if it
-- had died running them: one death, which alone changes nothing (worker/deliveries.py).
-- (lib/streams.lua's read_new)
-- KEYS: [1] stream, [2] running, [3] meta
-- ARGV: [1] group, [2] consumer, [3] count, [4] generation
-- Returns {1 if they run now else 0, then each entry's ID, payload (nil if none), affinity key
-- (nil if none)}, or XREADGROUP's error as it gave it (NOGROUP: the job's stream is gone).
local mark = not generation_error(KEYS[3], ARGV[4])
return read_new(KEYS[1], KEYS[2], ARGV[1], ARGV[2], ARGV[3], mark)
