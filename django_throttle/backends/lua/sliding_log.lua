-- Sliding window log: an exact count of the requests of the last period. Spec code 'w'.
--
-- Spec "w[!]<capacity>:<period>": capacity C requests (at most MAX_LOG_COUNT = 10,000) per
-- sliding period P in whole microseconds (<= MAX_WINDOW).
--
-- State per key: a sorted set with one member per unit of cost taken, scored by the
-- microsecond it was taken at; member "<now base 36>.<n>", n counting on from the highest
-- number already taken in that microsecond (0 in a new one), so members of one microsecond
-- stay unique even after the period shrank (an edit) and older entries left the count.
-- Live entries: score > now - P (a score in the future, from a clock that stepped back, is
-- live). A key of another type reads as nothing used and is replaced on the next write.
-- Decide at now with cost c: count = live entries; allowed iff count + c <= C.
--   allowed: remaining = C - count - c, reset = newest live score (now, if c > 0) + P - now,
--            retry 0; writes: drops dead entries, adds c members at now, TTL = reset
--            (nothing when c = 0 and nothing is live)
--   denied:  remaining = C - count (0 if the capacity was lowered below it), reset = newest
--            live score + P - now, retry = t_k + P - now where t_k is the score of the k-th
--            oldest live entry, k = count + c - C: the moment enough entries have left
-- Work per request: O(log n + c) (ZCOUNT, one ZRANGE, ZADD of c members); memory O(C).
-- Every duration is within [0, P].
-- Retime: entries are kept; the TTL becomes newest + P_new - now (deleted when nothing is
-- live any more).
-- Refund c of the hit at `taken`: up to c entries scored at taken are removed (the
-- highest-numbered, so the next hit's members stay unique): the refunded request's own, never
-- a later request's; none there (it left the period) gives back nothing. Without taken, the
-- c newest live entries. Then dead ones are trimmed, TTL = newest live + P - now; the key is
-- deleted when nothing live is left. A key of another type is left alone.

-- Its commands leave a score, longer than a state, in argument position 2.
PLACEHOLDER = true

-- Members per ZADD: unpack() of a whole 10,000-request cost would overflow Lua's C stack.
local LOG_BATCH = 500

local function log_parse(capacity, text, now, p)
  if capacity > MAX_LOG_COUNT then
    return nil, 'capacity must be at most ' .. MAX_LOG_COUNT .. ' for the sliding window log, '
      .. 'not ' .. capacity
  end
  local period, message = period_field(text, 'sliding window log')
  if period == nil then return nil, message end
  p.period = period
  return p, nil
end

-- The newest score in the log, or nil when it is empty.
local function log_newest(key)
  local newest = redis.call('ZRANGE', key, -1, -1, 'WITHSCORES')
  return newest[2] and tonumber(newest[2]) or nil
end

local function log_clamp(duration, period)
  if duration < 0 then return 0 end
  if duration > period then return period end
  return duration
end

-- The number after the highest "<stamp>.<n>" already scored at now: the first free one.
local function log_next_number(key, now)
  local next = 0
  local at = string.format('%d', now)
  for _, member in ipairs(redis.call('ZRANGEBYSCORE', key, at, at)) do
    local n = tonumber(string.match(member, '%.(%d+)$'))
    if n and n >= next then next = n + 1 end
  end
  return next
end

local function log_decide(key, now, p, cost)
  local capacity, period = p.capacity, p.period
  local floor = '(' .. string.format('%d', now - period)
  local count = redis.pcall('ZCOUNT', key, floor, '+inf')
  local replace = false
  if type(count) ~= 'number' then
    count, replace = 0, true  -- not a sorted set: nothing used, replaced on write
  end
  local newest = nil
  if count > 0 then newest = log_newest(key) end
  if count + cost <= capacity then
    local first = 0
    if cost > 0 and newest == now then first = log_next_number(key, now) end
    if cost > 0 and (newest == nil or newest < now) then newest = now end
    local reset = newest and log_clamp(newest + period - now, period) or 0
    local pending = nil
    if cost > 0 or count > 0 then pending = {cost, first, reset, replace} end
    return true, capacity - count - cost, reset, 0, pending
  end
  local k = count + cost - capacity
  local oldest = redis.call('ZRANGEBYSCORE', key, floor, '+inf', 'WITHSCORES', 'LIMIT', k - 1, 1)
  return false, math.max(0, capacity - count), log_clamp(newest + period - now, period),
    log_clamp(tonumber(oldest[2]) + period - now, period), nil
end

local function log_commit(key, now, p, pending)
  local cost, first, reset, replace = pending[1], pending[2], pending[3], pending[4]
  if replace then
    redis.call('DEL', key)
  else
    redis.call('ZREMRANGEBYSCORE', key, '-inf', string.format('%d', now - p.period))
  end
  local stamp, score = to36(now) .. '.', string.format('%d', now)
  local n = 0
  while n < cost do
    local args = {}
    for i = 1, math.min(LOG_BATCH, cost - n) do
      args[2 * i - 1], args[2 * i] = score, stamp .. (first + n)
      n = n + 1
    end
    redis.call('ZADD', key, unpack(args))
  end
  redis.call('PEXPIRE', key, px(reset))
end

ALGORITHMS['w'] = {
  stamped = true,
  parse = log_parse, decide = log_decide, commit = log_commit,
}

if RETIME then
  local function log_retime(key, now, p)
    local newest = redis.pcall('ZRANGE', key, -1, -1, 'WITHSCORES')
    newest = type(newest) == 'table' and newest[2] and tonumber(newest[2])
    if not newest then return 0 end
    return expire_or_delete(key, newest + p.period - now)
  end

  ALGORITHMS['w'].retime = log_retime
end

if REFUND then
  -- The number in a member "<stamp base 36>.<n>" (-1 if it has none).
  local function member_number(member)
    return tonumber(string.match(member, '%.(%d+)$')) or -1
  end

  -- Remove up to `left` of `members`, the highest-numbered first (the next hit numbers on
  -- from the highest left).
  local function remove_highest(key, members, left)
    table.sort(members, function(a, b) return member_number(a) > member_number(b) end)
    left = math.min(left, #members)
    local n = 0
    while n < left do
      local args = {}
      for i = 1, math.min(LOG_BATCH, left - n) do
        n = n + 1
        args[i] = members[n]
      end
      redis.call('ZREM', key, unpack(args))
    end
  end

  -- Drop the dead entries; TTL = newest live + P - now, or the key deleted when none is left.
  local function log_settle(key, now, period)
    redis.call('ZREMRANGEBYSCORE', key, '-inf', string.format('%d', now - period))
    local newest = log_newest(key)
    if newest == nil then return delete(key) end
    redis.call('PEXPIRE', key, px(log_clamp(newest + period - now, period)))
    return 1
  end

  ALGORITHMS['w'].refund = function(key, now, p, cost, taken)
    local period = p.period
    local live = redis.pcall('ZCOUNT', key, '(' .. string.format('%d', now - period), '+inf')
    if type(live) ~= 'number' then return 0 end
    if live == 0 then return redis.call('DEL', key) end
    if taken ~= nil then
      -- The refunded hit's own entries, scored at its microsecond (entries of one
      -- microsecond are alike: any of them counts the same). Already gone (left the
      -- period, or refunded before): nothing to give back.
      if taken <= now - period then return 0 end
      local at = string.format('%d', taken)
      local own = redis.call('ZRANGEBYSCORE', key, at, at)
      if #own == 0 then return 0 end
      remove_highest(key, own, cost)
      return log_settle(key, now, period)
    end
    if live <= cost then return delete(key) end
    -- Everything scored above the cost-th newest entry goes, and the rest of the cost from
    -- the entries at its score, the highest-numbered first (the next hit numbers on from
    -- the highest left).
    local score = string.format('%d', tonumber(redis.call('ZREVRANGE', key, cost - 1, cost - 1,
      'WITHSCORES')[2]))
    local left = cost - redis.call('ZREMRANGEBYSCORE', key, '(' .. score, '+inf')
    remove_highest(key, redis.call('ZRANGEBYSCORE', key, score, score), left)
    return log_settle(key, now, period)
  end
end
