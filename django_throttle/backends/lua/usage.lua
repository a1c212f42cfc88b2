-- Usage counting: what happened to each request, per minute, inside the decision's own call.
--
-- Loaded after the algorithm files and before a driver. count_usage writes only keys under
-- the shard tag it is given (e.g. "dt:{3}"), so it shares the Redis Cluster slot of the
-- call's other keys. Per shard and minute (minute = floor(now / 60 s), since the Unix epoch):
--   <tag>u<minute>            hash: "<outcome letter><usage field>" -> requests. Exact.
--   <tag>t<letter><minute>    sorted set per outcome: client label -> requests, at most
--                             USAGE_TOP members, kept with the Space-Saving rule: a client not
--                             in a full set replaces the smallest and inherits its count + n,
--                             so every client above 1/USAGE_TOP of the shard's requests that
--                             minute is listed and a listed count is high by at most the
--                             count it inherited. Allowed requests are sampled (one in
--                             USAGE_SAMPLE, weighted), so the allowed scores are estimates.
-- Outcome letters: a allowed, d denied, s shadow would-deny, o failed open, c failed closed.
-- Every key gets a TTL of USAGE_TTL seconds when it is created; the rollup
-- (manage.py throttle_usage --rollup) copies finished minutes to the database before then.
-- Memory per minute (measured by bench/bench_usage.py, Redis 7.0, 16 shards): the hashes
-- hold a field per shard x tier x endpoint x outcome seen, about 800 bytes per tier x
-- endpoint x minute with allowed and denied in every shard (1,800 with all five outcomes;
-- 2,400 once a shard's hash outgrows hash-max-listpack-entries); the top lists hold at most
-- USAGE_TOP members per shard and outcome, about 21 bytes each (118 beyond
-- zset-max-listpack-entries, 128). Cost: 1 command (HINCRBY) for an allowed request outside
-- the sample; otherwise 2 when the client is listed, 5 when it replaces the smallest (2.5 and
-- 6.5 us of script time on the benchmark machine).
--
-- API keys (client label "key:<prefix>"): <tag>k, a sorted set of key prefix -> the last
-- second (Unix) a decision counted that key, so the admin can say when a key was last used
-- without a database write per request (manage.py throttle_usage --rollup copies it to
-- ApiKey.last_used). Cost: one ZADD per decision of a key client (none for others); when the
-- member is new, EXPIRE (KEYS_SEEN_TTL, armed only then) and ZCARD, and beyond KEYS_SEEN_MAX
-- members per shard the least recently used are dropped (their time is in the database after a
-- rollup). Memory (MEMORY USAGE, Redis 7.0, 8-character prefixes): about 17 bytes per key while
-- a shard's set holds at most zset-max-listpack-entries (128), about 113 beyond; so at most
-- 1.1 MB per shard.
--
-- Writes use redis.pcall and ignore errors (a key of the wrong type, OOM): counting must never
-- fail or undo a decision that was already written.

local USAGE_TTL, USAGE_TOP, USAGE_SAMPLE = 10800, 63, 8 -- @settings (rewritten from Django settings at load)
-- Keys' last use: members per shard, and seconds the set outlives its newest member.
local KEYS_SEEN_MAX, KEYS_SEEN_TTL = 10000, 2592000

-- Record in `seen` (the shard's <tag>k) that the API key of `client` ("key:<prefix>") was
-- used at now (microseconds).
local function note_key_use(seen, now, client)
  if string.sub(client, 1, 4) ~= 'key:' then return end
  -- GT: a late or test-clock call never moves a key's last use back.
  if redis.pcall('ZADD', seen, 'GT', string.format('%d', math.floor(now / 1000000)),
      string.sub(client, 5)) ~= 1 then
    return
  end
  redis.pcall('EXPIRE', seen, KEYS_SEEN_TTL)
  local size = redis.pcall('ZCARD', seen)
  if type(size) == 'number' and size > KEYS_SEEN_MAX then
    redis.pcall('ZREMRANGEBYRANK', seen, 0, size - KEYS_SEEN_MAX - 1)
  end
end

-- Count n (default 1) requests of `client` under `field` and `outcome` in the minute of the
-- keys `totals` and `top` (see usage_keys). now: microseconds; field, client: strings of at
-- most 512 and 200 bytes; outcome: one letter. A single allowed request (no n: the decision's own
-- call) enters the top list only one time in USAGE_SAMPLE, picked by the clock's
-- microseconds, counting USAGE_SAMPLE: most decisions then cost one command here, and a
-- client's listed count stays an unbiased estimate. The decision's own call also records an
-- API key client's last use in `seen` (note_key_use); counts pushed later (n given, seen nil)
-- do not.
local function count_into(totals, top, seen, now, field, client, outcome, n)
  if n == nil and seen then note_key_use(seen, now, client) end
  local sampled = n == nil and outcome == 'a' and USAGE_SAMPLE > 1
  n = n or 1
  if redis.pcall('HINCRBY', totals, outcome .. field, n) == n then
    -- The field is new, and maybe the key: (re)arm its TTL.
    redis.pcall('EXPIRE', totals, USAGE_TTL)
  end
  if sampled then
    if now % USAGE_SAMPLE ~= 0 then return end
    n = USAGE_SAMPLE
  end
  -- Already listed: one command. (An error reply is a table, also truthy: give up quietly.)
  if redis.pcall('ZADD', top, 'XX', 'INCR', n, client) then return end
  local size = redis.pcall('ZCARD', top)
  if type(size) ~= 'number' then return end
  local score = n
  if size >= USAGE_TOP then
    local smallest = redis.pcall('ZPOPMIN', top)
    if type(smallest) == 'table' and smallest[2] then
      score = (tonumber(smallest[2]) or 0) + n
    end
    size = size - 1
  end
  redis.pcall('ZADD', top, score, client)
  if size == 0 then
    redis.pcall('EXPIRE', top, USAGE_TTL)
  end
end

-- Keys the driver's call declares after its limits' (KEYS[at + 1 ..]): the totals hash and
-- the top lists (allowed, denied, shadow) of the caller's minute, the key-use set and the
-- late minutes, all of one shard tag.
local USAGE_KEYS = 6
local TOP_AT = {a = 2, d = 3, s = 4}

-- count_into the usage keys the driver's call declared after its `at` limit keys. Their
-- minute is the caller's (its clock, so that it can name them); when the server's clock is
-- already past it (a call at a minute boundary, or a caller whose clock is behind), the
-- minute is noted in the late set, as a push notes its minutes, so that a rollup that already
-- copied it copies it again.
local function count_usage(at, now, field, client, outcome)
  count_into(KEYS[at + 1], KEYS[at + TOP_AT[outcome]], KEYS[at + 5], now, field, client,
    outcome)
  local minute = tonumber(string.match(KEYS[at + 1], 'u(%d+)$'))
  if minute and minute < math.floor(now / 60000000) then
    local second = math.floor(now / 1000000)
    redis.pcall('ZADD', KEYS[at + 6], second, string.format('%d', minute))
    redis.pcall('ZREMRANGEBYSCORE', KEYS[at + 6], '-inf',
      '(' .. string.format('%d', second - USAGE_TTL))
    redis.pcall('EXPIRE', KEYS[at + 6], USAGE_TTL)
  end
end
