-- Fixed window counter. Spec code 'f'.
--
-- Spec "f[!]<capacity>:<period>": capacity C requests per window; period P in whole
-- microseconds (<= MAX_WINDOW). Windows are [k x P, (k + 1) x P) since the Unix epoch.
--
-- State per key: "<count> <start base 36>": requests counted in the window starting at
-- `start` (microseconds). Missing or corrupt state reads as nothing counted in now's window.
-- Read at now: a start in the future (clock stepped back) is moved to now's window, keeping
-- its count; a window still open (now < start + P) keeps its count; else the count is 0 and
-- the window is max(now's grid window, start + P).
-- Decide with cost c: allowed iff count + c <= C.
--   allowed: remaining = C - count - c, reset = end - now, retry 0; writes (count + c,
--            start) with TTL end - now
--   denied:  remaining = C - count (0 if the capacity was lowered below it), reset = end - now,
--            retry = end - now
-- A client can pass 2 x C within one P straddling a boundary: the price of one counter.
-- Retime: the count is kept for the stored window, which now ends at start + P_new; the TTL
-- becomes start + P_new - now (the key is deleted when that has passed).
-- Refund c: in the window read as decide reads it, if it is still open, the count becomes
-- count - c, written with TTL end - now (deleted at 0); a past window is left alone, and so
-- is the stored window when the refunded hit (taken) was counted before it started.

local FIXED_PATTERN = '^(%d+) ([%da-z]+)$'

local function fixed_parse(capacity, text, now, p)
  local period, message = period_field(text, 'fixed window')
  if period == nil then return nil, message end
  p.period = period
  return p, nil
end

-- The count and window start that apply at now.
local function fixed_read(state, now, period)
  local grid = now - now % period
  local count, start = window_state(state, FIXED_PATTERN)
  if count == nil then return 0, grid end
  if start > now then start = grid end
  if now < start + period then return count, start end
  return 0, math.max(grid, start + period)
end

local function window_decide(count, start, stop, now, capacity, cost)
  if count + cost <= capacity then
    return true, capacity - count - cost, stop - now, 0, {count + cost, start, stop}
  end
  return false, math.max(0, capacity - count), stop - now, stop - now, nil
end

local function window_commit(key, now, p, pending)
  return string.format('%d', pending[1]) .. ' ' .. to36(pending[2]), pending[3] - now
end

local function fixed_decide(key, now, p, cost)
  local count, start = fixed_read(redis.call('GET', key), now, p.period)
  return window_decide(count, start, start + p.period, now, p.capacity, cost)
end

ALGORITHMS['f'] = {
  stamped = true,
  parse = fixed_parse, decide = fixed_decide, commit = window_commit,
}

if RETIME then
  local function fixed_retime(key, now, p)
    local count, start = window_state(redis.call('GET', key), FIXED_PATTERN)
    if count == nil then return 0 end
    return expire_or_delete(key, math.min(start + p.period - now, p.period))
  end

  ALGORITHMS['f'].retime = fixed_retime
end

-- Give back to a window counter: `left` requests counted in [start, stop), or the key
-- deleted when none are (refund scripts only; the calendar quota uses it too).
local window_refund
if REFUND then
  window_refund = function(key, now, left, start, stop)
    if left <= 0 then return delete(key) end
    store(key, window_commit(key, now, nil, {left, start, stop}))
    return 1
  end

  ALGORITHMS['f'].refund = function(key, now, p, cost, taken)
    local count, start = window_state(redis.call('GET', key), FIXED_PATTERN)
    if count == nil then return 0 end
    if start > now then
      start = now - now % p.period
    elseif now >= start + p.period then
      return 0
    end
    -- A hit counted in an earlier window than the one stored: that count is gone already.
    if taken ~= nil and taken < start then return 0 end
    return window_refund(key, now, count - cost, start, start + p.period)
  end
end
