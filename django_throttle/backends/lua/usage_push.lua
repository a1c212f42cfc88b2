-- Add counts a process kept (every decision it made, and those made while Redis could not
-- answer) to the minutes they happened in, at most once per batch. Loaded after usage.lua.
--
-- KEYS[1]  the batch's mark "<tag>p<batch id>" (tag: a shard tag such as "dt:{3}", whose hash
--          tag names the shard's slot; every key below shares it): set when the batch is
--          applied, with a TTL of USAGE_TTL, so a retry after a lost reply is skipped and the
--          marks of past batches expire on their own (one small key per batch, never a
--          structure that grows while pushes keep coming)
-- KEYS[2]  "<tag>l", the minutes pushes wrote to (a sorted set: minute -> the second it was
--          last pushed to), so the rollup copies them again even if it had already passed
--          them; minutes last pushed to more than USAGE_TTL ago (their counts have expired)
--          are trimmed on every push, so it holds at most the minutes of the last USAGE_TTL
-- KEYS[3]  "<tag>k", the API keys' last use (see usage.lua)
-- KEYS[2 + 2i], KEYS[3 + 2i]  count i's totals hash "<tag>u<minute>" and top list
--          "<tag>t<outcome letter><minute>" (see usage.lua)
-- ARGV[6(i-1) + 1 ..]  per count: minute (whole minutes since the Unix epoch), usage field,
--          client label, outcome letter, requests (a whole number >= 1), and the last second
--          (Unix) an API key client ("key:<prefix>") was used, or 0
-- Reply: 1 when applied, 0 when skipped as a repeat; an error (nothing written) when the keys
--        and counts do not match.
if #KEYS ~= 3 + 2 * (#ARGV / 6) or #ARGV % 6 ~= 0 then
  return redis.error_reply('django_throttle: expected 3 + 2 keys per count and 6 arguments '
    .. 'per count, got ' .. #KEYS .. ' keys and ' .. #ARGV .. ' arguments')
end
if not redis.call('SET', KEYS[1], '1', 'NX', 'EX', USAGE_TTL) then return 0 end
local late = KEYS[2]
local seen = {}
for i = 1, #ARGV / 6 do
  local at = 6 * (i - 1)
  local minute, n = tonumber(ARGV[at + 1]), tonumber(ARGV[at + 5])
  if minute and n and n >= 1 and minute >= 0 then
    minute = math.floor(minute)
    local second = tonumber(ARGV[at + 6]) or 0
    count_into(KEYS[2 + 2 * i], KEYS[3 + 2 * i], second > 0 and KEYS[3] or nil,
      second * 1000000, ARGV[at + 2], ARGV[at + 3], ARGV[at + 4], math.floor(n))
    seen[minute] = true
  end
end
local second = tonumber(redis.call('TIME')[1])
for minute in pairs(seen) do
  redis.pcall('ZADD', late, second, string.format('%d', minute))
end
redis.pcall('ZREMRANGEBYSCORE', late, '-inf', '(' .. string.format('%d', second - USAGE_TTL))
redis.pcall('EXPIRE', late, USAGE_TTL)
return 1
