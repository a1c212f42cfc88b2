-- Token bucket with continuous, exact refill. Spec code 't'.
--
-- Spec "t[!]<capacity>:<interval>": capacity C in tokens (the burst); interval T in
-- microseconds to earn one token back (period x 1e6 / count, any finite float > 0, written
-- as Python's repr, or a whole number as <digits>e<zeros>); C x T <= MAX_WINDOW.
--
-- State per key: U tokens used as of the millisecond ts_ms, in 12 bytes
-- struct.pack('>dI4', U, ts_ms % 2^32) when C x T <= 2e12 us (its memory per key: see
-- docs/explanation/benchmarks.md), else 14 bytes '>dI4I2' (U, ts_ms % 2^32, floor(ts_ms / 2^32)).
-- The compact form keeps only the low 32 bits of the millisecond: the key lives at most
-- C x T <= 2e12 us (23 days), well inside the +-2^31 ms (24.8 days) the reader resolves
-- around now. Anything else counts as nothing used.
-- Storing what was used (not what is left, and not a time at which the bucket is full)
-- keeps the state independent of the rate: an operator who raises a limit gives clients the
-- new headroom at once, one who lowers it never hands out a burst (used is capped at the
-- capacity: an empty bucket stays empty).
--
-- Decide at now (whole microseconds) with cost c: used as of now (below), after = used + c;
-- allowed iff after <= C + TOLERANCE.
--   allowed: remaining = floor(C - after + TOL), reset = (after - TOL/2) x T, retry 0;
--            writes (if after > 0) with TTL after x T
--   denied:  remaining = floor(C - used + TOL), reset = (used - TOL/2) x T,
--            retry = (after - C - TOL/2) x T, at most c x T
-- Waits are less half the tolerance the comparison forgives: float noise never rounds an
-- exact wait up to the next microsecond, and a retry at now + ceil(retry) passes. Used is
-- read up to C + TOL, not C: a hit the tolerance admitted leaves that much, and a slow rate
-- (T of a day) turns the TOL x T it would hide into a Retry-After milliseconds early. Every
-- duration is within [0, C x T] (a wait of c x T always suffices, as used <= C + TOL),
-- whatever the stored state: a timestamp in the future (clock stepped back, another server)
-- counts as no time elapsed.
-- Retime: the state is kept (used is rate-independent); the TTL becomes used x T_new. A
-- compact state retimed to a spec with C x T_new > 2e12 us is rewritten in the 14-byte form
-- first: its key may now live for years, and a 32-bit millisecond read months later would
-- resolve to the wrong time (a client locked out for months while the bucket should refill).
-- Refund c: after = min(used as of now, C) - c, written as a hit writes it (TTL after x T); at or
-- below TOLERANCE the bucket is full again and the key is deleted.

local COMPACT_WINDOW = 2e12

local function bucket_parse(capacity, text, now, p)
  if string.find(text, ':', 1, true) then
    return nil, 'limit spec must be <code>[!]<capacity>:<interval>, not ' .. text
  end
  local interval = tonumber(text)
  if interval == nil or interval ~= interval or interval <= 0 or interval >= math.huge then
    return nil, 'interval must be a finite number of microseconds above 0, not ' .. text
  end
  if capacity * interval > MAX_WINDOW then
    return nil, 'capacity x interval must be at most ' .. MAX_WINDOW .. ' microseconds'
  end
  p.interval, p.compact = interval, capacity * interval <= COMPACT_WINDOW
  return p, nil
end

-- Tokens used as of `now`, within [0, capacity + TOLERANCE], and the whole millisecond the
-- state was written at (a compact state's low 32 bits read as the millisecond nearest now);
-- nil for a missing key or corrupt state.
local function bucket_used(state, now, capacity, interval)
  if type(state) ~= 'string' then return nil end
  local n, used, low, high = #state, nil, nil, 0
  local stamp_ms
  if n == 12 then
    used, low = struct.unpack('>dI4', state)
    local now_ms = math.floor(now / 1000)
    local d = (now_ms - low) % 4294967296
    if d >= 2147483648 then d = d - 4294967296 end
    stamp_ms = now_ms - d
  elseif n == 14 then
    used, low, high = struct.unpack('>dI4I2', state)
    stamp_ms = high * 4294967296 + low
  else
    return nil
  end
  if used ~= used or used == math.huge or used == -math.huge then return nil end
  -- Written up to 999 us ahead (the millisecond is rounded up); beyond, the clock stepped
  -- back and no time elapsed.
  local elapsed = math.max(now - stamp_ms * 1000, -999)
  local full = capacity + TOLERANCE
  if used > full then used = full end
  used = used - elapsed / interval
  if used < 0 then return 0, stamp_ms end
  if used > full then return full, stamp_ms end
  return used, stamp_ms
end

local function bucket_decide(key, now, p, cost)
  local capacity, interval = p.capacity, p.interval
  local used = bucket_used(redis.call('GET', key), now, capacity, interval) or 0
  local after = used + cost
  local longest = capacity * interval
  if after <= capacity + TOLERANCE then
    return true, math.max(0, math.floor(capacity - after + TOLERANCE)),
      math.min(longest, math.max(0, (after - TOLERANCE / 2) * interval)), 0,
      after > 0 and after or nil
  end
  return false, math.max(0, math.floor(capacity - used + TOLERANCE)),
    math.min(longest, math.max(0, (used - TOLERANCE / 2) * interval)),
    math.min(cost * interval, math.max(0, (after - capacity - TOLERANCE / 2) * interval)), nil
end

local function bucket_commit(key, now, p, after)
  local interval = p.interval
  local stamp_ms = math.ceil(now / 1000)
  local used = after - (stamp_ms * 1000 - now) / interval
  local low = stamp_ms % 4294967296
  local state
  if p.compact then
    state = struct.pack('>dI4', used, low)
  else
    state = struct.pack('>dI4I2', used, low, (stamp_ms - low) / 4294967296)
  end
  return state, after * interval
end

ALGORITHMS['t'] = {
  parse = bucket_parse, decide = bucket_decide, commit = bucket_commit,
}

if RETIME then
  local function bucket_retime(key, now, p)
    local state = redis.call('GET', key)
    local used, stamp_ms = bucket_used(state, now, p.capacity, p.interval)
    if used == nil then return 0 end
    local ttl = used * p.interval
    if #state == 12 and not p.compact and ttl > 0 then
      -- A compact state may now outlive the +-24.8 days its 32-bit stamp resolves: written
      -- again in the full form, as it stands (same tokens used as of the same millisecond).
      local raw, low = struct.unpack('>dI4', state)
      store(key, struct.pack('>dI4I2', raw, low, (stamp_ms - low) / 4294967296), ttl)
      return 1
    end
    return expire_or_delete(key, ttl)
  end

  ALGORITHMS['t'].retime = bucket_retime
end

if REFUND then
  ALGORITHMS['t'].refund = function(key, now, p, cost)
    local used = bucket_used(redis.call('GET', key), now, p.capacity, p.interval)
    if used == nil then return 0 end
    -- From at most the capacity: a refund of everything empties a bucket the tolerance
    -- overfilled, instead of leaving a crumb of it on the edge of the deletion test.
    local after = math.min(used, p.capacity) - cost
    if after <= TOLERANCE then return delete(key) end
    store(key, bucket_commit(key, now, p, after))
    return 1
  end
end
