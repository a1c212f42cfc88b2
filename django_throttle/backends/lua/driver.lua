-- Check and consume every limit of one request atomically, all-or-nothing. Usage is counted
-- in the calling process, never here (see usage_push.lua).
--
-- KEYS[i]    counter of limit i (i = 1 .. n, n = #KEYS); all keys of one call share one hash
--            tag "<prefix>:{<shard>}", so they live in one Redis Cluster slot
-- ARGV[1]    cost: whole tokens in [0, 1e9], clamped per limit to its capacity
-- ARGV[2]    "1" to only look (decide as that cost would, write nothing), "0" to consume
-- ARGV[2+i]  limit i's spec "<code>[!~]<capacity>:<parameters>", see limit_spec in the
--            prelude and the algorithm files
-- ARGV[3+n]  optional: now in whole microseconds since the Unix epoch (tests); absent or ""
--            for the server's TIME (the request path leaves it out: 6 bytes fewer a call)
-- ARGV[4+n]  the request's lease id (1 to 64 letters, digits, '-' or '_'): required when a
--            limit is a concurrency limit (code 'n'), which holds its slot under it until
--            lease.lua releases it; absent otherwise
-- Reply: an array of four to eight integers, in this order; the last ones are left out when
-- they and every one after them are 0 (an allowed hit with no shadow denial and no stamp, the
-- common answer, is four: each integer left out is a line fewer for the client to parse)
--   1 allowed        1 or 0
--   2 index          the reported limit (1-based; 0 when no enforced limit was passed)
--   3 remaining      whole tokens left in it
--   4 reset_us       microseconds until it is full again (rounded up)
--   5 retry_us       microseconds until the same request would be allowed (0 when allowed)
--   6 spared         0, or, when shadow limits would have denied, their indexes as text
--                    ("2" or "2,5"): each was left unchanged (see below), so a refund of
--                    this hit must leave it out (it would give back tokens never taken)
--   7 taken_us       for an allowed hit (not a peek) with a limit whose refund depends on when
--                    it was taken (sliding log, windows, calendar quota: `stamped` in their
--                    ALGORITHMS entry), the microsecond its tokens were taken at, which
--                    refund.lua takes to give back exactly what this hit took; else 0
--   8 wait_us        for an allowed request, microseconds until its reserved turn: the
--                    longest wait a delaying limit (gcra.lua's at_once and max_wait) asks of
--                    it, 0 when it may proceed at once; 0 when denied
-- Or an error naming the first bad argument, with nothing written.
-- Every argument is validated before anything is read or written. Enforced limits are
-- all-or-nothing: nothing is written unless every one allows. A shadow limit that would deny
-- is reported and left unchanged; the others are consumed with the enforced ones. The
-- reported limit is the denying one with the longest wait, else the enforced one with the
-- fewest tokens left; shadow limits are never reported, nor quiet ones ('~', the load
-- shedder's) unless they deny (with no other limit to report, remaining and reset are 0).
-- Each algorithm decides on what it read; the writes follow only when every enforced limit
-- allowed, so a denial writes nothing. Every write sets a TTL equal to the time until the
-- state stops mattering (the limit is whole again), at most 3660 days.
local n, argc = #KEYS, #ARGV
if argc < 2 + n or argc > 4 + n then
  return redis.error_reply(ERROR .. 'expected ' .. (2 + n) .. ' to ' .. (4 + n)
    .. ' arguments for ' .. n .. ' keys, got ' .. argc)
end
if argc == 4 + n then
  LEASE = ARGV[4 + n]
  if #LEASE > 64 or string.match(LEASE, LEASE_ID) == nil then
    return redis.error_reply(ERROR .. 'ARGV[' .. (4 + n) .. '] lease id must be 1 to 64 '
      .. 'letters, digits, "-" or "_", not ' .. LEASE)
  end
end
-- Checked here rather than by whole(): a function call costs a call as much as building a
-- table (see docs/explanation/benchmarks.md).
local cost = tonumber(ARGV[1])
if cost == nil or cost ~= cost or cost < 0 or cost > MAX_COUNT or cost ~= math.floor(cost) then
  return redis.error_reply(ERROR .. 'ARGV[1] cost must be a whole number in [0, ' .. MAX_COUNT
    .. '], not ' .. ARGV[1])
end
if ARGV[2] ~= '0' and ARGV[2] ~= '1' then
  return redis.error_reply(ERROR .. "ARGV[2] peek must be '0' or '1', not " .. ARGV[2])
end
local peek = ARGV[2] == '1'
-- The clock, read here rather than through clock.lua's function (one function fewer built
-- per call): ARGV[3 + n] (whole microseconds; tests pass it) or the server's TIME.
local now = ARGV[3 + n]
if now == nil or now == '' then
  local t = redis.call('TIME')
  now = tonumber(t[1]) * 1000000 + tonumber(t[2])
else
  local text = now
  now = whole(text, 0, 2 ^ 53)
  if now == nil then
    return redis.error_reply(ERROR .. 'ARGV[' .. (3 + n) .. '] now must be whole microseconds, '
      .. 'not ' .. text)
  end
end
-- Each limit's params, with its algorithm, whether it is a shadow limit and (once decided)
-- what its commit writes: one table per limit, the fewest a call builds.
local params = {}
-- Whether a limit's refund depends on when the hit was made (see the reply).
local stamped = false
for i = 1, n do
  local algorithm, p, _, bad = limit_spec(2 + i, now)
  if bad then return bad end
  params[i] = p
  if algorithm.stamped then stamped = true end
  if p.code == 'n' and LEASE == nil then
    return redis.error_reply(ERROR .. 'ARGV[' .. (2 + i) .. '] is a concurrency limit: the call '
      .. 'needs a lease id as ARGV[' .. (4 + n) .. ']')
  end
end

local allowed, spared = true, 0
local pick, pick_remaining, pick_reset, pick_retry = 0, nil, 0, -1
local wait = 0
for i = 1, n do
  local p = params[i]
  local shadow = p.shadow
  local c = cost
  if c > p.capacity then c = p.capacity end
  local ok, remaining, reset, retry, write, delay = p.algorithm.decide(KEYS[i], now, p, c)
  if ok then
    p.pending = write
    if delay and not shadow and delay > wait then wait = delay end
    if not shadow and not p.quiet and allowed
        and (pick_remaining == nil or remaining < pick_remaining) then
      pick, pick_remaining, pick_reset = i, remaining, reset
    end
  elseif shadow then
    p.pending = nil
    spared = spared == 0 and tostring(i) or spared .. ',' .. i
  else
    if allowed or retry > pick_retry then
      pick, pick_remaining, pick_reset, pick_retry = i, remaining, reset, retry
    end
    allowed = false
  end
end

if allowed and not peek then
  for i = 1, n do
    local p = params[i]
    if p.pending ~= nil then
      local key = KEYS[i]
      local state, ttl_us = p.algorithm.commit(key, now, p, p.pending)
      if state ~= nil then
        -- store() written out: a function call costs about what building a table does.
        if PLACEHOLDER then redis.call('SET', key, '') end
        redis.call('SET', key, state, 'PX', math.max(1, math.ceil(ttl_us / 1000)))
      end
    end
  end
end
if allowed then pick_retry = 0 else wait = 0 end
local taken = 0
if allowed and not peek and stamped then taken = now end
pick_retry, wait = math.ceil(pick_retry), math.ceil(wait)
local head = allowed and 1 or 0
pick_remaining, pick_reset = math.floor(pick_remaining or 0), math.ceil(pick_reset)
if wait == 0 and taken == 0 and spared == 0 and pick_retry == 0 then
  return {head, pick, pick_remaining, pick_reset}
end
local reply = {head, pick, pick_remaining, pick_reset, pick_retry, spared, taken, wait}
local size = 8
while reply[size] == 0 do
  reply[size] = nil
  size = size - 1
end
return reply
