-- Sliding window counter: the current window's count plus the previous one's, weighted by
-- how much of it the sliding period still covers. Spec code 's'. Approximate by design (it
-- assumes the previous window's requests were spread evenly) and O(1) in time and memory.
--
-- Spec "s[!]<capacity>:<period>": capacity C requests per sliding period P in whole
-- microseconds (<= MAX_WINDOW). Windows are [k x P, (k + 1) x P) since the Unix epoch.
--
-- State per key: "<cur> <prev> <start base 36>": cur requests counted in the window starting
-- at start, prev in the window before it. Missing or corrupt state reads as (0, 0).
-- Read at now, w = now's window start: a start in the future counts as w; start >= w keeps
-- (cur, prev); start >= w - P gives (0, cur); anything older (0, 0). e = now - w;
-- estimate = prev x (P - e) / P + cur (in floats, in this order).
-- Decide with cost c: allowed iff estimate + c <= C + TOLERANCE.
--   allowed: cur += c, writes (cur, prev, w) with TTL = reset (at least 1 ms), unless both
--            counts are 0 (that reads as a missing key: nothing is written);
--            remaining = floor(C - estimate - c + TOL), retry 0
--   denied:  remaining = floor(C - estimate + TOL); retry, when the estimate has fallen far
--            enough: with cur + c <= C, (P - e) - (C - cur - c) x P / prev (prev's weight
--            shrinks); else the next window, (P - e) + max(0, P - (C - c) x P / cur)
--   reset:   w + 2P - now while cur > 0 (it still weighs in the next window), else
--            w + P - now while prev > 0, else 0. Reset and retry can reach 2P.
-- A retry at now + retry passes; one a little earlier may pass too (the estimate is not a
-- log of exact times).
-- Retime: counts are kept; the TTL becomes start + 2 P_new - now (deleted once passed).
-- Refund c: a state of now's window (start >= w) gets cur = max(0, cur - c), written as
-- (cur, prev, w) with TTL = reset (deleted when both counts are 0); an older state is left
-- alone (its requests now weigh as the previous window's), and so is a state of now's window
-- when the refunded hit (taken) was counted in an earlier one.

local COUNTER_PATTERN = '^(%d+) (%d+) ([%da-z]+)$'

local function counter_parse(capacity, text, now, p)
  local period, message = period_field(text, 'sliding window counter')
  if period == nil then return nil, message end
  p.period = period
  return p, nil
end

local function counter_reset(cur, prev, w, now, period)
  if cur > 0 then return w + 2 * period - now end
  if prev > 0 then return w + period - now end
  return 0
end

local function counter_decide(key, now, p, cost)
  local capacity, period = p.capacity, p.period
  local w = now - now % period
  local cur, prev, start = window_state(redis.call('GET', key), COUNTER_PATTERN)
  if cur == nil then
    cur, prev = 0, 0
  else
    if start > now then start = w end
    if start >= w then
      -- the stored window is now's: both counts apply
    elseif start >= w - period then
      cur, prev = 0, cur
    else
      cur, prev = 0, 0
    end
  end
  local e = now - w
  local estimate = prev * (period - e) / period + cur
  if estimate + cost <= capacity + TOLERANCE then
    local after = cur + cost
    local reset = counter_reset(after, prev, w, now, period)
    -- (0, 0) reads exactly as a missing key: nothing worth writing
    local write = nil
    if reset > 0 then write = {after, prev, w, reset} end
    return true, math.max(0, math.floor(capacity - estimate - cost + TOLERANCE)), reset, 0,
      write
  end
  local retry
  if cur + cost <= capacity then
    retry = (period - e) - (capacity - cur - cost) * period / prev
  else
    retry = (period - e) + math.max(0, period - (capacity - cost) * period / cur)
  end
  return false, math.max(0, math.floor(capacity - estimate + TOLERANCE)),
    counter_reset(cur, prev, w, now, period), math.max(0, retry), nil
end

local function counter_commit(key, now, p, pending)
  return string.format('%d %d ', pending[1], pending[2]) .. to36(pending[3]), pending[4]
end

ALGORITHMS['s'] = {
  stamped = true,
  parse = counter_parse, decide = counter_decide, commit = counter_commit,
}

if RETIME then
  local function counter_retime(key, now, p)
    local cur, _, start = window_state(redis.call('GET', key), COUNTER_PATTERN)
    if cur == nil then return 0 end
    return expire_or_delete(key, start + 2 * p.period - now)
  end

  ALGORITHMS['s'].retime = counter_retime
end

if REFUND then
  ALGORITHMS['s'].refund = function(key, now, p, cost, taken)
    local period = p.period
    local w = now - now % period
    local cur, prev, start = window_state(redis.call('GET', key), COUNTER_PATTERN)
    if cur == nil or start < w then return 0 end
    if taken ~= nil and taken < w then return 0 end
    cur = math.max(0, cur - cost)
    local reset = counter_reset(cur, prev, w, now, period)
    if reset <= 0 then return delete(key) end
    store(key, counter_commit(key, now, p, {cur, prev, w, reset}))
    return 1
  end
end
