-- tool_hold: a runner says it still runs a tool call: the call's entry, if it is still in this
-- runner's hands, has its idle time reset (no other runner takes it over) and the call's claim
-- is renewed (no asker queues it again). An entry another runner took over stays theirs.
-- KEYS: [1] the tool's calls (stream), [2] the call's claim
-- ARGV: [1] group, [2] the runner (consumer), [3] the entry ID, [4] claim's time to live (ms)
-- Returns 1 when it is still this runner's, else 0.
local page = redis.pcall('XPENDING', KEYS[1], ARGV[1], ARGV[3], ARGV[3], 1)
if page.err or #page == 0 or page[1][2] ~= ARGV[2] then return 0 end
redis.call('XCLAIM', KEYS[1], ARGV[1], ARGV[2], 0, ARGV[3], 'JUSTID')
redis.call('PEXPIRE', KEYS[2], ARGV[4])
return 1
