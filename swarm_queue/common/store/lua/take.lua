-- take: a slot's read of new entries, marked running in the same step (as start.lua marks
-- them before their request is sent: one call a batch instead of two, which on a machine
-- whose system calls are dear is a fifth of Redis's work a prompt at the default batch).
-- A first delivery has no mark yet, so each is marked 1. Marked only when the job is of the
-- taker's generation (else the start before sending refuses the batch, as for any read), and
-- only entries without an affinity key (field 'a'): those may go to another endpoint's lane,
-- and are marked by their start where they run. A worker that dies between this read and
-- its request leaves a mark, as if it had died running them: their next taker runs them one
-- by one (worker/deliveries.py), answered still, each once.
-- (lib/streams.lua's read_new; a commit may read so too: lua/commit.lua)
-- KEYS: [1] stream, [2] running, [3] meta
-- ARGV: [1] group, [2] consumer, [3] count, [4] generation
-- Returns {1 if marked else 0, then each entry's ID, payload (nil if none), affinity key
-- (nil if none)}, or XREADGROUP's error as it gave it (NOGROUP: the job's stream is gone).
local mark = not generation_error(KEYS[3], ARGV[4])
return read_new(KEYS[1], KEYS[2], ARGV[1], ARGV[2], ARGV[3], mark)
