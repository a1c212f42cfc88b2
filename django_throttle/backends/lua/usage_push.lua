-- Add counts a process kept (every decision it made, and those made while Redis could not
-- answer) to the minutes they happened in, at most once per batch. Loaded after usage.lua.
-- The process sums its counts before sending (usage_store.RedisUsage.push): each exact total
-- comes once per call, and each client once per minute and outcome, whatever the number of
-- usage fields it was counted under; per top list at most USAGE_TOP clients of a batch, its
-- heaviest (more would fill the list anyway: see RedisUsage.push), and the API keys' last use
-- apart from the counts.
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
-- KEYS[4 ..]  the totals hashes "<tag>u<minute>" and top lists "<tag>t<outcome letter><minute>"
--          (see usage.lua) the counts below name by their index in KEYS, each key once
-- ARGV[1]  T, the number of totals that follow
-- ARGV[2 + 4(i-1) ..]  per total i (i = 1 .. T): the index of its totals hash in KEYS, its
--          minute (whole minutes since the Unix epoch), its field "<outcome letter><usage
--          field>", requests (a whole number, not 0: a correction is negative, see
--          redis.Tally.refuse)
-- ARGV[2 + 4T]  L, the number of top lists that follow
-- then per top list: the index of its top list in KEYS, m, and m pairs of a client label and
--          its requests (a whole number >= 1)
-- then, to the end, pairs of an API key client ("key:<prefix>") and the last second (Unix)
--          it was used
-- Reply: 1 when applied, 0 when skipped as a repeat; an error (nothing written) when the keys
--        and counts do not match.
local function whole(value)
  local n = tonumber(value)
  if n ~= nil and n >= 0 and n == math.floor(n) then return n end
  return nil
end
local function named(at)
  local index = tonumber(ARGV[at])
  return index ~= nil and index >= 4 and KEYS[index] ~= nil
end
local totals = whole(ARGV[1])
local valid = totals ~= nil and 4 * totals + 2 <= #ARGV
local lists = valid and whole(ARGV[2 + 4 * totals])
local last = #ARGV + 1 -- where the keys' last uses start
if lists then
  for at = 2, 1 + 4 * totals, 4 do
    if not named(at) then valid = false break end
  end
  local at = 3 + 4 * totals
  for _ = 1, lists do
    local m = whole(ARGV[at + 1])
    if not (valid and m and named(at) and at + 1 + 2 * m <= #ARGV) then valid = false break end
    at = at + 2 + 2 * m
  end
  last = at
  valid = valid and (#ARGV - last + 1) % 2 == 0
end
if not (valid and lists) then
  return redis.error_reply('django_throttle: expected ARGV[1] totals, 4 arguments per total '
    .. 'naming one of KEYS[4 ..], the number of top lists, each one of KEYS[4 ..] with its '
    .. 'number of clients and a client and count per client, then pairs of a key client and '
    .. 'second, got ' .. #KEYS .. ' keys and ' .. #ARGV .. ' arguments')
end
if not redis.call('SET', KEYS[1], '1', 'NX', 'EX', USAGE_TTL) then return 0 end
local seen = {}
local stop = 1 + 4 * totals
for at = 2, stop, 4 do
  local minute, n = tonumber(ARGV[at + 1]), tonumber(ARGV[at + 3])
  if minute and n and n ~= 0 and minute >= 0 then
    count_total(KEYS[tonumber(ARGV[at])], ARGV[at + 2], math.floor(n))
    seen[math.floor(minute)] = true
  end
end
local at = stop + 2
for _ = 1, lists do
  local top, m = KEYS[tonumber(ARGV[at])], tonumber(ARGV[at + 1])
  -- The list's member count once known, so a new client costs no ZCARD of its own.
  local size = nil
  for pair = at + 2, at + 2 * m, 2 do
    local n = tonumber(ARGV[pair + 1])
    if n and n >= 1 then size = count_top(top, ARGV[pair], math.floor(n), size) end
  end
  at = at + 2 + 2 * m
end
for pair = last, #ARGV, 2 do
  local second = tonumber(ARGV[pair + 1]) or 0
  if second > 0 then note_key_use(KEYS[3], second * 1000000, ARGV[pair]) end
end
local second = tonumber(redis.call('TIME')[1])
for minute in pairs(seen) do
  redis.pcall('ZADD', KEYS[2], second, string.format('%d', minute))
end
redis.pcall('ZREMRANGEBYSCORE', KEYS[2], '-inf', '(' .. string.format('%d', second - USAGE_TTL))
redis.pcall('EXPIRE', KEYS[2], USAGE_TTL)
return 1
