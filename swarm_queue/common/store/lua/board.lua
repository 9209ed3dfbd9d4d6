-- board: write a blackboard's state after a round, only over the round it was read at: a
-- driver that resumed elsewhere meanwhile (and moved the board on) is refused, not overwritten.
-- KEYS: [1] board
-- ARGV: [1] the round the writer read, [2] the round it writes, [3] the state (msgpack)
-- Returns 1 when written, 0 when the board had moved on (or back).
local have = tonumber(redis.call('HGET', KEYS[1], 'round') or '0')
if have ~= tonumber(ARGV[1]) then return 0 end
redis.call('HSET', KEYS[1], 'round', ARGV[2], 'state', ARGV[3])
return 1
