-- Add counts a process kept while Redis could not answer (failed open, failed closed, local
-- decisions) to the minutes they happened in, at most once per batch. Loaded after usage.lua.
--
-- KEYS[1]  a shard tag, e.g. "dt:{3}" (its hash tag names the shard's slot)
-- ARGV[1]  batch id: a batch whose id is already in <tag>p was applied before (its reply was
--          lost) and is skipped, so a retry never counts twice
-- ARGV[2 + 5(i-1) ..]  per count: minute (since the Unix epoch), usage field, client label,
--          outcome letter, requests (a whole number >= 1)
-- Reply: 1 when applied, 0 when skipped as a repeat.
-- The minutes written are added to <tag>l, so the rollup copies them again even if it had
-- already passed them.
local tag = KEYS[1]
local applied = tag .. 'p'
if redis.call('SADD', applied, ARGV[1]) == 0 then return 0 end
redis.call('EXPIRE', applied, USAGE_TTL)
local late = tag .. 'l'
local seen = {}
for i = 2, #ARGV - 4, 5 do
  local minute, n = tonumber(ARGV[i]), tonumber(ARGV[i + 4])
  if minute and n and n >= 1 and minute >= 0 then
    minute = math.floor(minute)
    count_usage(tag, minute * 60000000, ARGV[i + 1], ARGV[i + 2], ARGV[i + 3], math.floor(n))
    seen[minute] = true
  end
end
for minute in pairs(seen) do
  redis.call('SADD', late, string.format('%d', minute))
end
redis.call('EXPIRE', late, USAGE_TTL)
return 1
