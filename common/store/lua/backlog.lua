-- backlog: what of a job the workers still have to do, from the stream itself: entries in
-- workers' hands (pending) and whether any was never delivered. (The stream's length says
-- neither: acknowledged entries stay in it until its head is trimmed.)
-- KEYS: [1] stream
-- ARGV: [1] group
-- Returns {pending entries, 1 if any entry was never delivered else 0}.
local stream, group = KEYS[1], ARGV[1]
local info = group_info(stream, group)
return {info and info['pending'] or 0, any_undelivered(stream, info) and 1 or 0}
