-- tool_retake: a tool call claimed again by an asker whose try was lost (arq marked it taken
-- and no runner began it, or the runner that began it is gone), only if the claim still says
-- what it said of that try: a runner that began it meanwhile, or another asker that took it
-- over, keeps it.
-- KEYS: [1] claim
-- ARGV: [1] the claim as it was (the lost try's arq job ID, or BEGUN and its runner), [2] the
--       new claim's time to live (ms)
-- Returns 1 (claimed again) or 0.
if redis.call('GET', KEYS[1]) == ARGV[1] then
  redis.call('SET', KEYS[1], '1', 'PX', ARGV[2])
  return 1
end
return 0
