-- Usage counting: what happened to each request, per minute, as a process pushes the counts
-- it kept (usage_push.lua, loaded after this file; the counting call never counts usage).
--
-- count_into writes only keys under the shard tag it is given (e.g. "dt:{3}"), one Redis
-- Cluster slot. Per shard and minute (minute = floor(now / 60 s), since the Unix epoch):
--   <tag>u<minute>            hash: "<outcome letter><usage field>" -> requests. Exact.
--   <tag>t<letter><minute>    sorted set per outcome: client label -> requests, at most
--                             USAGE_TOP members, kept with the Space-Saving rule: a client not
--                             in a full set replaces the smallest and inherits its count + n,
--                             so every client above 1/USAGE_TOP of the shard's requests that
--                             minute is listed and a listed count is high by at most the
--                             count it inherited.
-- Outcome letters: a allowed, d denied, s shadow would-deny, o failed open, c failed closed.
-- Every key gets a TTL of USAGE_TTL seconds when it is created; the rollup
-- (manage.py throttle_usage --rollup) copies finished minutes to the database before then.
-- API keys (client label "key:<prefix>"): <tag>k, a sorted set of key prefix -> the last
-- second (Unix) a decision counted that key, so the admin can say when a key was last used
-- without a database write per request (manage.py throttle_usage --rollup copies it to
-- ApiKey.last_used). When a member is new, EXPIRE (KEYS_SEEN_TTL, armed only then) and ZCARD,
-- and beyond KEYS_SEEN_MAX members per shard the least recently used are dropped (their time
-- is in the database after a rollup).
--
-- Writes use redis.pcall and ignore errors (a key of the wrong type, OOM): counting must never
-- fail or undo a decision that was already written.

local USAGE_TTL, USAGE_TOP = 10800, 63 -- @settings (rewritten from Django settings at load)
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

-- Add n requests to the exact total `field` ("<outcome letter><usage field>") of the minute's
-- totals hash `totals`, (re)arming its TTL when the field is new.
local function count_total(totals, field, n)
  if redis.pcall('HINCRBY', totals, field, n) == n then
    -- The field is new, and maybe the key: (re)arm its TTL.
    redis.pcall('EXPIRE', totals, USAGE_TTL)
  end
end

-- Add n requests of `client` to the top list `top` (Space-Saving, see above). `size` is the
-- list's member count when the caller knows it (nil: ask ZCARD when needed); returns the
-- count after, or nil when unknown (an error reply: the caller asks again).
local function count_top(top, client, n, size)
  -- Already listed: one command. (An error reply is a table, also truthy: give up quietly.)
  if redis.pcall('ZADD', top, 'XX', 'INCR', n, client) then return size end
  if size == nil then
    size = redis.pcall('ZCARD', top)
    if type(size) ~= 'number' then return nil end
  end
  local score = n
  if size >= USAGE_TOP then
    local smallest = redis.pcall('ZPOPMIN', top)
    if type(smallest) == 'table' and smallest[2] then
      score = (tonumber(smallest[2]) or 0) + n
    end
    size = size - 1
  end
  if type(redis.pcall('ZADD', top, score, client)) ~= 'number' then return nil end
  if size == 0 then
    redis.pcall('EXPIRE', top, USAGE_TTL)
  end
  return size + 1
end

-- Count n (default 1) requests of `client` under `field` and `outcome` in the minute of the
-- keys `totals` and `top`, and with `seen` (the shard's <tag>k) record an API key client's use
-- at `now` (microseconds). field, client: strings; outcome: one letter.
local function count_into(totals, top, seen, now, field, client, outcome, n)
  if seen then note_key_use(seen, now, client) end
  n = n or 1
  count_total(totals, outcome .. field, n)
  count_top(top, client, n, nil)
end
