-- commit: the worker's atomic "write results + ack". First write wins: counters move only for
-- indices that had no result and were never collected and evicted (below the job's eviction
-- mark), so a redelivered or speculative copy changes nothing. A failure, and an answer from
-- the response cache, keeps its original entry (for swarm-retry) and counts under its kind.
-- Acknowledged entries lose their `running` marks and leave the stream with its acknowledged
-- head (trim_acked, every TRIM_EVERY results and once the job is finished). The last result
-- marks the job finished. Work of another generation of
-- the job (deleted or lost, and queued again under its name) is refused with GONE: nothing
-- written, nothing acked.
-- A pipeline step's commit also appends each new answer to its `landed` stream (index and
-- entry), where the pump that feeds the next step reads it: an answer moves on once, at once.
-- An agent's turn lands its failures too: its pump ends the agent with the failure (a
-- pipeline's failure stops at its step).
-- Below the eviction mark, only the entry swarm-retry queued an index again under (reopened)
-- may write it, once: its answer is for the collector to bring the file up to date.
-- An entry is acknowledged once every prompt it holds has a result: an entry of one prompt at
-- once, a chunk (common/store/entries.py; its size below) once the rest of it has one
-- too, from this commit or an earlier one (or was collected: below the eviction mark). A chunk
-- partly answered stays in its taker's hands, so no prompt of it is lost, and is marked in
-- the chunks hash ('~' and its ID) until it is whole, the job's PARTIAL counting the marks.
-- Only a commit writes results, and only for the entries it names: so a commit of whole
-- entries each still pending (its XACK acknowledged every one), none below the eviction mark,
-- while no entry of the job is partly answered, finds none of its prompts answered, and
-- writes them without reading for them first (a job from before the marks has no PARTIAL,
-- and is always read for). A whole chunk on its block, every prompt of it answered, comes as
-- its chunk's field (one argument, common/store/resultfields.py). A commit of such chunks
-- only, in a job that packs its chunks (meta PACKED), is the common case: written as the
-- fields came, first and apart from the rest, which costs a tenth of a batch's work in Lua
-- tables and calls it does not need (issue 50). Anywhere else a field is taken apart and
-- each prompt's written as any other's.
-- Tokens count as results do: each prompt's own usage only when its result is new (a copy's
-- answer, already written by the other copy, adds nothing), plus the request's tokens that no
-- result of it carries (a list whose server gave no usage per prompt) by the share of its
-- results that are new. Four counts each: prompt, completion, and of them cached and
-- reasoning (0 where not reported).
-- The arguments are few per prompt (two: index and result; a whole chunk's one), because
-- Redis's cost of a script grows with its argument count more than with anything it does: ten
-- a prompt cost 1.6x the Redis CPU of two at batch 256 (bench/chunkcost.py), and a chunk's
-- field in one argument 0.68x the instructions a prompt of its two a prompt (issue 50,
-- bench/redisinstr.py). What few prompts carry (a
-- failure's kind, an entry kept) comes apart, and each prompt's usage is summed, its detail
-- read only when some result of the commit is not new.
-- KEYS: [1] results, [2] meta, [3] stream, [4] failed, [5] cached, [6] running, [7] reopened,
--       [8] chunks, [9] landed (only for a pipeline step; then successes carry their entry
--       payload too)
-- ARGV: [1] group, [2] generation, [3] '1' if failures land too, [4] n prompts, [5..8] the
--       request's four counts, [9..12] the sum of the prompts' own four counts, [13] each
--       prompt's own counts, 'p c k r' or '' for none, joined by ',', [14] m, [15] x, then m
--       entry IDs to acknowledge if whole (a chunk taken again whose prompts were all
--       answered before), then x triples: prompt number (1..n), failure kind ('' on success, '+' on an
--       answer from the response cache), the entry payload to keep; then E, E triples: an
--       entry's ID, the count of its prompts here, and '' or, for a whole chunk on its block
--       answered (a producer's entry 0-(first+1), first a multiple of the chunk, no prompt
--       failed), its chunk's field (common/store/resultfields.py); then a pair, index and
--       result blob, for each prompt of the entries that came as ''. Prompts are numbered
--       (1..n) in the entries' order, each entry's in index order; indices are distinct.
-- Returns {new results done, new results failed, new of them from the cache, 2k, then kind,
-- count for each of the k kinds failed}. (A slot's next read goes in the same round trip, a
-- plain XREADGROUP right after: common/store/delivery.py.)
local results, meta, stream, failed_h, cached_h = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5]
local running, reopened, chunks, landed = KEYS[6], KEYS[7], KEYS[8], KEYS[9]
local group = ARGV[1]
-- The counters this commit moves, read with the generation: written back once at the end
-- (the script is atomic: a read and a write are an increment), not an HINCRBY each.
local COUNTED = {
  META.DONE, META.FAILED, META.CACHE_HITS, META.PROMPT_TOKENS, META.COMPLETION_TOKENS,
  META.CACHED_TOKENS, META.REASONING_TOKENS, META.TOTAL, META.FIRST_RESULT_S, META.FINISHED_S,
  META.CHUNK, META.PARTIAL, META.PACKED,
}
local gone, evicted, known = generation_error(meta, ARGV[2], COUNTED)
if gone then return gone end
local failures_land = ARGV[3] == '1'
-- A count, 0 for none (nil, or a field HMGET found false), without Lua 5.1's strtod for the
-- zeros most are: a string's tonumber costs several times a comparison of interned strings.
local function count(s) return (not s or s == '0') and 0 or tonumber(s) end
local n, m, x = tonumber(ARGV[4]), count(ARGV[14]), count(ARGV[15])
-- The job's chunk (its meta's; a job from before chunks were so recorded has none, 0, its
-- entries' sizes all in the chunks hash), and its entries partly answered (nil: a job from
-- before those marks, always read for).
local chunk = tonumber(known[13] or '0')
local partial = known[14] == '0' and 0 or tonumber(known[14] or '')
-- A job that packs its chunks keeps a whole chunk answered in one commit in one field (its
-- first index a multiple of the chunk; common/store/resultfields.py); none holds a failure.
local packed = chunk > 1 and known[15] == '1'
local function entry_first(id) return tonumber(string.match(id, '%-(%d+)$')) - 1 end
local function aligned(id)  -- the first index of a producer's chunk entry on a block, or nil
  if not packed or string.sub(id, 1, 2) ~= '0-' then return nil end
  local first = entry_first(id)
  return first % chunk == 0 and first or nil
end
-- What every commit ends with, once its results are written (`done`, `failed`, `hits` new
-- of them; `kinds`: kind -> count failed; `tokens`: the new results' own four counts;
-- `marked`: the job's partly answered entries now): the job's counters moved, its first
-- and last result's time, the stream's acknowledged head trimmed, the reply.
local function finish(done, failed, hits, kinds, tokens, marked)
  -- (A commit of no results, a flow's batch whose answers were committed as they came, counts
  -- its request's tokens whole.)
  local before = count(known[3]) + count(known[4])  -- (results the job had: done and failed)
  local share = n > 0 and (done + failed) / n or 1
  local moved = {done, failed, hits}
  for t = 1, 4 do moved[3 + t] = tokens[t] + math.floor(count(ARGV[4 + t]) * share + 0.5) end
  local counts = {}
  for c = 1, 7 do
    if moved[c] > 0 then
      counts[#counts + 1] = COUNTED[c]
      counts[#counts + 1] = string.format('%d', count(known[2 + c]) + moved[c])
    end
  end
  if marked ~= partial then
    counts[#counts + 1] = META.PARTIAL
    counts[#counts + 1] = string.format('%d', marked)
  end
  local over = known[12] and true or false
  -- Redis's clock is asked only for the job's first result and its last (a TIME and its
  -- string a commit were a thirtieth of Redis's work a batch at the default batch).
  if done + failed > 0 then
    local now
    if not known[11] then
      now = now_s()
      counts[#counts + 1] = META.FIRST_RESULT_S
      counts[#counts + 1] = now
    end
    local total = tonumber(known[10] or '')
    local finished = before + done + failed
    if total and not known[12] and finished >= total then
      counts[#counts + 1] = META.FINISHED_S
      counts[#counts + 1] = now or now_s()
      over = true
    end
  end
  if #counts > 0 then redis.call('HSET', meta, unpack(counts)) end
  -- The acknowledged head leaves the stream when the results pass a multiple of TRIM_EVERY,
  -- and at every commit of a finished job (a late copy's acknowledgement).
  if over or math.floor(before / TRIM_EVERY) ~= math.floor((before + done + failed) / TRIM_EVERY) then
    trim_acked(stream, group)
  end
  local out = {done, failed, hits, 0}
  for kind, count in pairs(kinds) do
    out[#out + 1] = kind
    out[#out + 1] = count
  end
  out[4] = #out - 4
  return out
end
-- The common case first, with none of the rest's tables: every entry (at most 500: one call
-- each) a whole chunk of the job on its block, at or past the eviction mark, that came as its
-- chunk's field, of a job that packs its chunks and has none partly answered; no failure, no
-- entry to ack alone. Written as it came once every entry proves pending (its XACK
-- acknowledged it: no commit wrote any of it before). Else (or an entry acknowledged
-- already: a copy's commit) the rest below, which acknowledges again (no change) and reads
-- for what is written already.
local E = tonumber(ARGV[16 + m + 3 * x])
if m == 0 and x == 0 and not landed and partial == 0 and packed and E <= 500 then
  local ids, fields = {}, {}
  for k = 17, 16 + 3 * E, 3 do
    local id, field = ARGV[k], ARGV[k + 2]
    local first = ARGV[k + 1] == known[13] and field ~= '' and aligned(id)
    if not first or first < evicted then
      ids = nil
      break
    end
    ids[#ids + 1] = id
    fields[#fields + 1] = RESULT_CHUNK_PREFIX .. first
    fields[#fields + 1] = field
  end
  if ids and #ids > 0 and redis.call('XACK', stream, group, unpack(ids)) == #ids then
    redis.call('HDEL', running, unpack(ids))
    local done = chunk * redis.call('HSET', results, unpack(fields))
    local tokens = {count(ARGV[9]), count(ARGV[10]), count(ARGV[11]), count(ARGV[12])}
    return finish(done, 0, 0, {}, tokens, 0)
  end
end
local extra = {}
local at = 16 + m
for k = at, at + 3 * x - 1, 3 do extra[tonumber(ARGV[k])] = k end
at = at + 3 * x
-- Each entry: its ID, its first prompt's number, how many, and its chunk's field if it came
-- as one. Prompt e's index is A[off + 2e], its blob next to it: ARGV's pairs, or where some
-- entry came as its field, a table of every prompt's (built only where one is read apart).
local entries, first, fields_came = {}, 1, false
for k = at + 1, at + 3 * tonumber(ARGV[at]), 3 do
  local c, field = tonumber(ARGV[k + 1]), ARGV[k + 2]
  entries[#entries + 1] = {ARGV[k], first, c, field ~= '' and field or nil}
  fields_came = fields_came or field ~= ''
  first = first + c
end
at = at + 3 * #entries + 1  -- (the first pair)
local A, off = ARGV, at - 2
-- A chunk's field's results, each after its index (`index`, index + 1...), appended to `out`:
-- RESULTS_MARK and a msgpack array of bin (common/store/resultfields.py).
local function unpack_field(value, index, out)
  local function int(pos, bytes)
    local v = 0
    for i = pos, pos + bytes - 1 do v = v * 256 + string.byte(value, i) end
    return v
  end
  local tag, pos, count = string.byte(value, 2), 3, 0
  if tag >= 144 and tag <= 159 then
    count = tag - 144
  elseif tag == 220 then
    count, pos = int(3, 2), 5
  else
    count, pos = int(3, 4), 7
  end
  for k = 0, count - 1 do
    local t, len = string.byte(value, pos), 0
    if t == 196 then
      len, pos = int(pos + 1, 1), pos + 2
    elseif t == 197 then
      len, pos = int(pos + 1, 2), pos + 3
    else
      len, pos = int(pos + 1, 4), pos + 5
    end
    out[#out + 1] = string.format('%d', index + k)
    out[#out + 1] = string.sub(value, pos, pos + len - 1)
    pos = pos + len
  end
end
-- Appends entry e's prompts, each index and blob, to `out`: from its field, or from ARGV's
-- pairs at `k`. Returns where the next entry's pairs start.
local function prompts_of(e, k, out)
  if e[4] then
    unpack_field(e[4], entry_first(e[1]), out)
    return k
  end
  for _ = 1, e[3] do
    out[#out + 1] = ARGV[k]
    out[#out + 1] = ARGV[k + 1]
    k = k + 2
  end
  return k
end
-- Every prompt's index and blob in one table, those of the entries that came as fields
-- unpacked: what reading or writing a prompt apart needs.
local function apart()
  if A ~= ARGV or not fields_came then return end
  local P, k = {}, at
  for _, e in ipairs(entries) do k = prompts_of(e, k, P) end
  A, off = P, -1
end
-- The entries whose every prompt has a result once this commit is written: each all of whose
-- prompts are here (the common case: a whole chunk, or one prompt; nothing read for it),
-- else a chunk whose other prompts were answered before (or collected: below the eviction
-- mark). An entry holds the job's chunk of prompts unless the chunks hash says otherwise,
-- or one if swarm-retry queued it (ID round-(index+1)).
local whole, open, held, ended, marks = {}, {}, {}, {}, {}
for k = 16, 15 + m do
  open[#open + 1] = ARGV[k]
  held[#open] = false
end
for _, e in ipairs(entries) do
  if e[3] == chunk then
    whole[#whole + 1] = e[1]
  else
    open[#open + 1] = e[1]
    held[#open] = e
  end
end
for lo = 1, #open, 500 do
  local part = {unpack(open, lo, math.min(lo + 499, #open))}
  local sizes = redis.call('HMGET', chunks, unpack(part))
  for i, id in ipairs(part) do
    local e = held[lo + i - 1]
    local size = tonumber(sizes[i] or '')
    if not size then size = string.match(id, '^0%-') and math.max(chunk, 1) or 1 end
    local complete = true
    local block = aligned(id)
    if block and redis.call('HEXISTS', results, RESULT_CHUNK_PREFIX .. block) == 1 then
      size = 1  -- (answered whole, in its chunk's field: a copy's commit, nothing new)
    end
    if size > 1 and not (e and e[3] == size) then  -- a chunk (ID 0-(first+1)) not all here
      local here = {}
      if e then
        apart()
        for f = e[2], e[2] + e[3] - 1 do here[A[off + 2 * f]] = true end
      end
      local rest = {}
      local first = entry_first(id)
      for index = first, first + size - 1 do
        local name = tostring(index)
        if index >= evicted and not here[name] then rest[#rest + 1] = name end
      end
      if #rest > 0 then
        for _, have in ipairs(redis.call('HMGET', results, unpack(rest))) do
          if not have then complete = false end
        end
      end
    end
    if complete then
      whole[#whole + 1] = id
      if sizes[i] then ended[#ended + 1] = id end
    elseif e and #redis.call('XPENDING', stream, group, id, id, 1) > 0 then
      -- (only while pending: a chunk acknowledged was made whole, and lost its size record,
      -- so a late copy's commit of part of it takes it for one of the job's chunk)
      marks[#marks + 1] = '~' .. id
      marks[#marks + 1] = '1'
    end
  end
end
for lo = 1, #ended, 500 do
  redis.call('HDEL', chunks, unpack(ended, lo, math.min(lo + 499, #ended)))
end
-- The acks come first: a Redis over its maxmemory refuses a script's first write only if
-- that write may grow memory (XACK, HDEL never do), so answers land even in a full Redis,
-- and the trim below frees their prompts (see common/room.py).
local acked = 0
for lo = 1, #whole, 500 do
  local part = {unpack(whole, lo, math.min(lo + 499, #whole))}
  acked = acked + redis.call('XACK', stream, group, unpack(part))
  redis.call('HDEL', running, unpack(part))
end
local fresh_entries = partial == 0 and m == 0 and x == 0 and #open == 0 and acked == #entries
for _, e in ipairs(fresh_entries and evicted > 0 and entries or {}) do
  if entry_first(e[1]) < evicted then fresh_entries = false end
end
-- One HMGET and one HSET per 500 prompts rather than an HSETNX each: Redis's cost per command
-- called from Lua is several times its cost per field.
-- When every result is new and plain, they are written as they came, without reading.
local done, failed, hits, kinds, stale = 0, 0, 0, {}, {}
local covered = {}  -- prompt number -> true where its chunk's field holds it already
if packed and not fresh_entries then
  local names, which = {}, {}
  for _, e in ipairs(entries) do
    local block = aligned(e[1])
    if block then
      names[#names + 1] = RESULT_CHUNK_PREFIX .. block
      which[#names] = e
    end
  end
  for lo = 1, #names, 500 do
    local got = redis.call('HMGET', results, unpack(names, lo, math.min(lo + 499, #names)))
    for i, value in ipairs(got) do
      local e = which[lo + i - 1]
      for f = value and e[2] or 1, value and e[2] + e[3] - 1 or 0 do covered[f] = true end
    end
  end
end
apart()
for lo = 1, n, 500 do
  local hi = math.min(lo + 499, n)
  local indices, have, plain = {}, {}, fresh_entries
  if not plain then
    for e = lo, hi do indices[#indices + 1] = A[off + 2 * e] end
    have = redis.call('HMGET', results, unpack(indices))
    for e = lo, hi do have[e - lo + 1] = have[e - lo + 1] or covered[e] or false end
    plain = x == 0 and evicted == 0
    for i = 1, plain and #have or 0 do
      if have[i] then plain = false end
    end
  end
  if plain then
    -- (HSET counts the fields it added: were one written already, by a worker from before
    -- the marks beside this one on the job, it is counted once still)
    done = done + redis.call('HSET', results, unpack(A, off + 2 * lo, off + 2 * hi + 1))
  else
    local again = evicted > 0 and redis.call('HMGET', reopened, unpack(indices)) or {}
    local fresh, lost, hit, moved, reclosed = {}, {}, {}, {}, {}
    for e = lo, hi do
      local index = A[off + 2 * e]
      local open = evicted == 0 or tonumber(index) >= evicted
      if not open and again[e - lo + 1] then  -- (rare: find the entry it came in)
        for _, en in ipairs(entries) do
          if e >= en[2] and e < en[2] + en[3] then open = again[e - lo + 1] == en[1] end
        end
      end
      if have[e - lo + 1] or not open then
        stale[e] = true
      else
        if tonumber(index) < evicted then reclosed[#reclosed + 1] = index end
        fresh[#fresh + 1] = index
        fresh[#fresh + 1] = A[off + 2 * e + 1]
        local k = extra[e]
        local kind = k and ARGV[k + 1] or ''
        if landed and (kind == '' or kind == '+' or failures_land) then
          moved[#moved + 1] = index
          moved[#moved + 1] = k and ARGV[k + 2] or ''
        end
        if kind == '' then
          done = done + 1
        elseif kind == '+' then
          done = done + 1
          hits = hits + 1
          hit[#hit + 1] = index
          hit[#hit + 1] = ARGV[k + 2]
        else
          failed = failed + 1
          kinds[kind] = (kinds[kind] or 0) + 1
          lost[#lost + 1] = index
          lost[#lost + 1] = ARGV[k + 2]
        end
      end
    end
    if #fresh > 0 then redis.call('HSET', results, unpack(fresh)) end
    if #reclosed > 0 then redis.call('HDEL', reopened, unpack(reclosed)) end
    if #lost > 0 then redis.call('HSET', failed_h, unpack(lost)) end
    if #hit > 0 then redis.call('HSET', cached_h, unpack(hit)) end
    for k = 1, #moved, 2 do
      redis.call('XADD', landed, '*', 'i', moved[k], 'd', moved[k + 1])
    end
  end
end
-- The partly answered entries' marks: each written left marked, each made whole unmarked
-- (looked for only while the job has some). A job from before the marks keeps none.
local marked = partial
if partial and #marks > 0 then
  for k = 1, #marks, 500 do
    marked = marked + redis.call('HSET', chunks, unpack(marks, k, math.min(k + 499, #marks)))
  end
end
if partial and partial > 0 then
  local unmarks = {}
  for i, id in ipairs(whole) do unmarks[i] = '~' .. id end
  for lo = 1, #unmarks, 500 do
    marked = marked - redis.call('HDEL', chunks, unpack(unmarks, lo, math.min(lo + 499, #unmarks)))
  end
end
for kind, count in pairs(kinds) do
  redis.call('HINCRBY', meta, FAILED_KIND_PREFIX .. kind, count)
end
-- The prompts' own tokens: their sum when every result is new, else those of the new ones.
local tokens = {count(ARGV[9]), count(ARGV[10]), count(ARGV[11]), count(ARGV[12])}
if next(stale) and ARGV[13] ~= '' then
  tokens = {0, 0, 0, 0}
  local e = 0
  for counts in string.gmatch(ARGV[13] .. ',', '([^,]*),') do
    e = e + 1
    if not stale[e] and counts ~= '' then
      local t = 0
      for count in string.gmatch(counts, '%d+') do
        t = t + 1
        tokens[t] = tokens[t] + tonumber(count)
      end
    end
  end
end
return finish(done, failed, hits, kinds, tokens, marked)
