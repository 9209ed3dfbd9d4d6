-- dim: an embeddings job's dimension, fixed by the first answer that comes to ask (every
-- later vector of the job must have it), in the job of the generation the work was taken from.
-- KEYS: [1] meta
-- ARGV: [1] generation, [2] the dimension of this answer's vectors
-- Returns the job's dimension (this answer's, if it is the first), or GONE.
local gone = generation_error(KEYS[1], ARGV[1])
if gone then return gone end
redis.call('HSETNX', KEYS[1], META.DIM, ARGV[2])
return tonumber(redis.call('HGET', KEYS[1], META.DIM))
