-- commit: the worker's atomic "write results + ack". First write wins: counters move only for
-- indices that had no result and were never collected and evicted (below the job's eviction
-- mark), so a redelivered or speculative copy changes nothing. A failure, and an answer from
-- the response cache, keeps its original entry (for swarm-retry) and counts under its kind. Acknowledged entries
-- lose their `running` marks and leave the stream with its acknowledged head (trim_acked).
-- The last result marks the job finished. Work of another generation of the job (deleted or
-- lost, and queued again under its name) is refused with GONE: nothing written, nothing acked.
-- A pipeline step's commit also appends each new answer to its `landed` stream (index and
-- entry), where the pump that feeds the next step reads it: an answer moves on once, at once.
-- An agent's turn lands its failures too: its pump ends the agent with the failure (a
-- pipeline's failure stops at its step).
-- Below the eviction mark, only the entry swarm-retry queued an index again under (reopened)
-- may write it, once: its answer is for the collector to bring the file up to date.
-- An entry is acknowledged once every prompt it holds has a result: an entry of one prompt at
-- once, a chunk (common/store/entries.py; its size in KEYS[8]) once the rest of it has one
-- too, from this commit or an earlier one (or was collected: below the eviction mark). A chunk
-- partly answered stays in its taker's hands, so no prompt of it is lost.
-- KEYS: [1] results, [2] meta, [3] stream, [4] failed, [5] cached, [6] running, [7] reopened,
--       [8] chunks, [9] landed (only for a pipeline step; then successes carry their entry
--       payload too)
-- Tokens count as results do: each entry's own usage only when its result is new (a copy's
-- answer, already written by the other copy, adds nothing), plus the request's tokens that no
-- result of it carries (ARGV[5..8]: a list whose server gave no usage per prompt) by the
-- share of its results that are new (all: all of it; a copy that lost: none). Four counts
-- each: prompt, completion, and of them cached and reasoning (0 where not reported).
-- ARGV: [1] group, [2] generation, [3] '1' if failures land too, [4] n, [5..8] the request's
--       four counts, [9] m, then m entry IDs to acknowledge if whole (a chunk taken again
--       whose prompts were all answered before), then per prompt five: entry_id, index, result blob, failure kind ('' on
--       success, '+' on a success answered from the response cache), original entry payload;
--       then, only for the entries that carry usage of their own, five: the entry's number
--       (1..n) and its four counts (sparse: a list whose server gave no per-prompt usage
--       sends none, and two arguments per prompt measured 0.93x the throughput at batch 32)
-- Returns {new results done, new results failed, new of them from the cache, then kind,
-- count for each kind failed}.
local results, meta, stream, failed_h, cached_h = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5]
local running, reopened, chunks, landed = KEYS[6], KEYS[7], KEYS[8], KEYS[9]
local group, now = ARGV[1], now_s()
local gone, evicted = generation_error(meta, ARGV[2])
if gone then return gone end
local failures_land = ARGV[3] == '1'
-- Prompt e's five arguments are ARGV[base + 5 * e] .. ARGV[base + 5 * e + 4].
local n, m = tonumber(ARGV[4]), tonumber(ARGV[9])
local base = 5 + m
local done, failed, hits, kinds, seen = 0, 0, 0, {}, {}
local tokens = {0, 0, 0, 0}
local own = {}
for u = base + 5 * n + 5, #ARGV, 5 do own[tonumber(ARGV[u])] = u end
-- The entries whose every prompt has a result once this commit is written: each of a job
-- without chunks (one prompt an entry, the common case: no table a prompt), else each whose
-- chunk is complete.
local whole = {}
if redis.call('EXISTS', chunks) == 0 then
  for k = 10, 9 + m do whole[#whole + 1] = ARGV[k] end
  for e = 1, n do whole[#whole + 1] = ARGV[base + 5 * e] end
else
  local order, mine, ended = {}, {}, {}
  for k = 10, 9 + m do
    mine[ARGV[k]] = {}
    order[#order + 1] = ARGV[k]
  end
  for e = 1, n do
    local id = ARGV[base + 5 * e]
    if not mine[id] then
      mine[id] = {}
      order[#order + 1] = id
    end
    mine[id][ARGV[base + 5 * e + 1]] = true
  end
  for lo = 1, #order, 500 do
    local part = {unpack(order, lo, math.min(lo + 499, #order))}
    local sizes = redis.call('HMGET', chunks, unpack(part))
    for i, id in ipairs(part) do
      local size, rest = tonumber(sizes[i] or '1'), {}
      if size > 1 then  -- a chunk: the producer's, ID 0-(first+1)
        local first = tonumber(string.match(id, '%-(%d+)$')) - 1
        for index = first, first + size - 1 do
          if index >= evicted and not mine[id][tostring(index)] then
            rest[#rest + 1] = tostring(index)
          end
        end
      end
      local complete = true
      if #rest > 0 then
        for _, have in ipairs(redis.call('HMGET', results, unpack(rest))) do
          if not have then complete = false end
        end
      end
      if complete then
        whole[#whole + 1] = id
        if size > 1 then ended[#ended + 1] = id end
      end
    end
  end
  for lo = 1, #ended, 500 do
    redis.call('HDEL', chunks, unpack(ended, lo, math.min(lo + 499, #ended)))
  end
end
-- The acks come first: a Redis over its maxmemory refuses a script's first write only if
-- that write may grow memory (XACK, HDEL never do), so answers land even in a full Redis,
-- and the trim below frees their prompts (see common/room.py).
for lo = 1, #whole, 500 do
  local part = {unpack(whole, lo, math.min(lo + 499, #whole))}
  redis.call('XACK', stream, group, unpack(part))
  redis.call('HDEL', running, unpack(part))
end
-- One HMGET and one HSET per chunk rather than an HSETNX per entry: Redis's cost per command
-- called from Lua is several times its cost per field.
for lo = 1, n, 500 do
  local hi = math.min(lo + 499, n)
  local indices = {}
  for e = lo, hi do
    indices[#indices + 1] = ARGV[base + 5 * e + 1]
  end
  local have = redis.call('HMGET', results, unpack(indices))
  local again = evicted > 0 and redis.call('HMGET', reopened, unpack(indices)) or {}
  local fresh, lost, hit, moved, reclosed = {}, {}, {}, {}, {}
  for e = lo, hi do
    local b = base + 5 * e
    local index = ARGV[b + 1]
    local open = tonumber(index) >= evicted or again[e - lo + 1] == ARGV[b]
    if not have[e - lo + 1] and not seen[index] and open then
      if tonumber(index) < evicted then reclosed[#reclosed + 1] = index end
      seen[index] = true
      local u = own[e]
      if u then
        for t = 1, 4 do tokens[t] = tokens[t] + tonumber(ARGV[u + t]) end
      end
      fresh[#fresh + 1] = index
      fresh[#fresh + 1] = ARGV[b + 2]
      local kind = ARGV[b + 3]
      if landed and (kind == '' or kind == '+' or failures_land) then
        moved[#moved + 1] = index
        moved[#moved + 1] = ARGV[b + 4]
      end
      if kind == '' then
        done = done + 1
      elseif kind == '+' then
        done = done + 1
        hits = hits + 1
        hit[#hit + 1] = index
        hit[#hit + 1] = ARGV[b + 4]
      else
        failed = failed + 1
        kinds[kind] = (kinds[kind] or 0) + 1
        lost[#lost + 1] = index
        lost[#lost + 1] = ARGV[b + 4]
      end
    end
  end
  if #fresh > 0 then redis.call('HSET', results, unpack(fresh)) end
  if #reclosed > 0 then redis.call('HDEL', reopened, unpack(reclosed)) end
  if #lost > 0 then redis.call('HSET', failed_h, unpack(lost)) end
  if #hit > 0 then redis.call('HSET', cached_h, unpack(hit)) end
  for m = 1, #moved, 2 do
    redis.call('XADD', landed, '*', 'i', moved[m], 'd', moved[m + 1])
  end
end
for kind, count in pairs(kinds) do
  redis.call('HINCRBY', meta, FAILED_KIND_PREFIX .. kind, count)
end
trim_acked(stream, group)
-- (A commit of no results, a flow's batch whose answers were committed as they came, counts
-- its request's tokens whole.)
local share = n > 0 and (done + failed) / n or 1
local counters = {
  META.PROMPT_TOKENS, META.COMPLETION_TOKENS, META.CACHED_TOKENS, META.REASONING_TOKENS,
}
for t = 1, 4 do
  local count = tokens[t] + math.floor(tonumber(ARGV[4 + t]) * share + 0.5)
  if count > 0 then redis.call('HINCRBY', meta, counters[t], count) end
end
if done + failed > 0 then
  if done > 0 then redis.call('HINCRBY', meta, META.DONE, done) end
  if hits > 0 then redis.call('HINCRBY', meta, META.CACHE_HITS, hits) end
  if failed > 0 then redis.call('HINCRBY', meta, META.FAILED, failed) end
  redis.call('HSETNX', meta, META.FIRST_RESULT_S, now)
  redis.call('HSET', meta, META.LAST_RESULT_S, now)
  local total = redis.call('HGET', meta, META.TOTAL)
  if total then
    local d = tonumber(redis.call('HGET', meta, META.DONE) or '0')
    local f = tonumber(redis.call('HGET', meta, META.FAILED) or '0')
    if d + f >= tonumber(total) then redis.call('HSETNX', meta, META.FINISHED_S, now) end
  end
end
local out = {done, failed, hits}
for kind, count in pairs(kinds) do
  out[#out + 1] = kind
  out[#out + 1] = count
end
return out
