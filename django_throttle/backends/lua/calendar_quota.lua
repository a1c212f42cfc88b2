-- Calendar quota: a fixed window whose windows follow the calendar. Spec code 'c'; loaded
-- after fixed_window.lua, whose decide and commit it shares.
--
-- Spec "c[!]<capacity>:<b0>:<b1>:<b2>:<b3>": capacity C requests per window; four window
-- boundaries in whole Unix microseconds, strictly increasing, with b0 <= now < b3: the
-- previous window's start, the current one's, the next one's and the one after, as Python
-- computed them (django_throttle.calendar.windows: local midnight, Monday, the 1st or 1
-- January in the quota's time zone; Lua cannot read time zones). The script picks the window
-- [b_i, b_i+1) holding its own clock, so a server clock a little off Python's still counts in
-- the right window.
--
-- State per key: "<count> <start base 36>", as the fixed window. Read at now: a stored start
-- at or after b_i counts in this window (and is kept); else the count is 0 and start = b_i.
-- Decide with cost c: allowed iff count + c <= C; reset and retry = b_i+1 - now (the quota
-- comes back whole at the next boundary); TTL b_i+1 - now.
-- Retime: a count of the current window keeps it, with TTL b_i+1 - now; an older one is
-- deleted.
-- Refund c: a count of the current window becomes count - c, with TTL b_i+1 - now (deleted at
-- 0); an older one is left alone, as is the current one when the refunded hit (taken) was
-- counted in an earlier window.

local function calendar_parse(capacity, text, now, p)
  local t0, t1, t2, t3 = string.match(text, '^([^:]*):([^:]*):([^:]*):([^:]*)$')
  local b0, b1 = t0 and whole(t0, 0, 2 ^ 53), t1 and whole(t1, 0, 2 ^ 53)
  local b2, b3 = t2 and whole(t2, 0, 2 ^ 53), t3 and whole(t3, 0, 2 ^ 53)
  if not (b0 and b1 and b2 and b3 and b0 < b1 and b1 < b2 and b2 < b3) then
    return nil, 'calendar boundaries must be 4 increasing whole microseconds '
      .. '<b0>:<b1>:<b2>:<b3>, not ' .. text
  end
  if now < b0 or now >= b3 then
    return nil, 'calendar boundaries must cover now (' .. string.format('%d', now) .. '), not '
      .. text
  end
  local start, stop = b2, b3
  if now < b1 then
    start, stop = b0, b1
  elseif now < b2 then
    start, stop = b1, b2
  end
  if stop - start > MAX_WINDOW then
    return nil, 'calendar window must be at most ' .. MAX_WINDOW .. ' microseconds'
  end
  p.start, p.stop = start, stop
  return p, nil
end

local function calendar_decide(key, now, p, cost)
  local count, start = window_state(redis.call('GET', key), FIXED_PATTERN)
  if count == nil or start < p.start then count, start = 0, p.start end
  return window_decide(count, start, p.stop, now, p.capacity, cost)
end

ALGORITHMS['c'] = {
  stamped = true,
  parse = calendar_parse, decide = calendar_decide, commit = window_commit,
}

if RETIME then
  local function calendar_retime(key, now, p)
    local count, start = window_state(redis.call('GET', key), FIXED_PATTERN)
    if count == nil then return 0 end
    if start < p.start then return expire_or_delete(key, 0) end
    return expire_or_delete(key, p.stop - now)
  end

  ALGORITHMS['c'].retime = calendar_retime
end

if REFUND then
  ALGORITHMS['c'].refund = function(key, now, p, cost, taken)
    local count, start = window_state(redis.call('GET', key), FIXED_PATTERN)
    if count == nil or start < p.start then return 0 end
    if taken ~= nil and taken < p.start then return 0 end
    return window_refund(key, now, count - cost, start, p.stop)
  end
end
