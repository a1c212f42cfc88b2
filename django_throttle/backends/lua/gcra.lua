-- GCRA, the generic cell rate algorithm: a token bucket kept as one instant. Spec code 'g'.
--
-- Spec "g[!]<capacity>:<emission>[:<at_once>:<max_wait>]": capacity C in tokens (the burst);
-- emission interval E in whole microseconds per token (>= 1); C x E <= MAX_WINDOW. With the
-- last two fields the limit delays instead of only rejecting (nginx's limit_req with burst
-- and delay): of the C requests it admits at once, the first at_once (in [1, C]) are served
-- at once and the others wait their turn, one E apart; max_wait (whole microseconds in
-- [1, MAX_WINDOW]) is the longest a request may be asked to wait.
--
-- State per key: the theoretical arrival time TAT in whole microseconds, stored as a decimal
-- integer so Redis keeps it int-encoded (MEMORY USAGE 72 for a short key). The bucket is
-- empty until TAT - C x E and full from TAT on. Missing or corrupt state reads as TAT = now.
-- Everything is integer arithmetic on values below 2^53: exact, no tolerance.
--
-- Decide at now with cost c: tat = max(stored, now), capped at now + C x E (a state from a
-- clock that ran ahead); new = tat + c x E; allowed iff new - now <= C x E.
--   allowed: remaining = floor((C x E - (new - now)) / E), reset = new - now, retry 0;
--            writes new (if new > now) with TTL new - now
--   denied:  remaining = floor((C x E - (tat - now)) / E), reset = tat - now,
--            retry = new - now - C x E
-- Delaying: wait = max(0, tat + min(c, floor(room / E)) x E - now - at_once x E), the time
-- until the request's reserved turn (room below: a request costing more than room admits
-- waits for the turn of the last token that fits, and still takes c); allowed iff
-- new - now <= C x E and wait <= max_wait: then as above, and the decision carries the wait
-- (its turn is reserved: new is written, so requests waiting together are spaced exactly E
-- apart); else denied, nothing reserved, retry = the time until both hold
-- for the same request: max(new - now - C x E, wait - max_wait).
-- Remaining then counts within room = min(C x E, at_once x E + max_wait) instead of C x E
-- (at least 0): a request whose wait would pass max_wait is refused however much of the
-- burst is free, so it is the number of requests sent now that are really admitted.
-- Retime: with the old spec (E_old), tokens used are kept: tat' = now + ceil((tat - now) x
-- E_new / E_old), capped at now + C_new x E_new (exact, see ceil_muldiv), written with TTL
-- tat' - now; without it only the TTL is re-set to tat - now. A TAT at or before now is
-- deleted (nothing used).
-- Refund c: tat = the stored TAT as decide reads it; new = tat - c x E, written with TTL
-- new - now, or the key deleted when new <= now. A corrupt state is left alone.

local function gcra_parse(capacity, text, now, p)
  local emission_text, at_once_text, max_wait_text = text, nil, nil
  if string.find(text, ':', 1, true) then
    emission_text, at_once_text, max_wait_text = string.match(text, '^([^:]+):([^:]+):([^:]+)$')
    if emission_text == nil then
      return nil, 'limit spec must be g[!]<capacity>:<emission>[:<at_once>:<max_wait>], not '
        .. text
    end
  end
  local emission = whole(emission_text, 1, MAX_WINDOW)
  if emission == nil then
    return nil, 'emission interval must be whole microseconds in [1, ' .. MAX_WINDOW
      .. '], not ' .. emission_text
  end
  if capacity * emission > MAX_WINDOW then
    return nil, 'capacity x emission interval must be at most ' .. MAX_WINDOW .. ' microseconds'
  end
  p.emission = emission
  if at_once_text == nil then return p, nil end
  local at_once = whole(at_once_text, 1, capacity)
  if at_once == nil then
    return nil, 'requests served at once must be a whole number in [1, ' .. capacity
      .. '], not ' .. at_once_text
  end
  local max_wait = whole(max_wait_text, 1, MAX_WINDOW)
  if max_wait == nil then
    return nil, 'longest wait must be whole microseconds in [1, ' .. MAX_WINDOW .. '], not '
      .. max_wait_text
  end
  p.at_once, p.max_wait = at_once, max_wait
  return p, nil
end

-- The stored TAT as of now: within [now, now + C x E].
local function gcra_tat(state, now, limit)
  local tat = tonumber(state)
  if tat == nil or tat ~= math.floor(tat) or tat <= now or tat >= 2 ^ 53 then return now end
  if tat - now > limit then return now + limit end
  return tat
end

local function gcra_decide(key, now, p, cost)
  local emission = p.emission
  local limit = p.capacity * emission
  local tat = gcra_tat(redis.call('GET', key), now, limit)
  local new = tat + cost * emission
  local at_once = p.at_once
  if at_once == nil then
    if new - now <= limit then
      return true, math.floor((limit - (new - now)) / emission), new - now, 0,
        new > now and new or nil
    end
    return false, math.floor((limit - (tat - now)) / emission), tat - now, new - now - limit, nil
  end
  -- How far ahead of now turns may be reserved: the burst, or less when the longest wait
  -- refuses a request before the burst is used up. Remaining counts within it: the requests
  -- sent now that are really admitted.
  local room = math.min(limit, at_once * emission + p.max_wait)
  -- The request's turn is that of its last token, or of the last that fits in room when it
  -- costs more: else it would wait longer than max_wait even with the bucket full, and never
  -- pass. It is charged its whole cost all the same (as a cost above the capacity is charged
  -- the capacity): it passes when the bucket is full rather than never.
  local turn = tat + math.min(cost, math.floor(room / emission)) * emission
  local wait = math.max(0, turn - now - at_once * emission)
  if new - now <= limit and wait <= p.max_wait then
    return true, math.max(0, math.floor((room - (new - now)) / emission)), new - now, 0,
      new > now and new or nil, wait
  end
  return false, math.max(0, math.floor((room - (tat - now)) / emission)), tat - now,
    math.max(new - now - limit, wait - p.max_wait), nil
end

local function gcra_commit(key, now, p, new)
  return string.format('%d', new), new - now
end

ALGORITHMS['g'] = {
  parse = gcra_parse, decide = gcra_decide, commit = gcra_commit,
}

if RETIME then
  -- x x y as (high, middle, low) in base 2^25, exactly, for whole x, y < 2^50.
  local function product(x, y)
    local base = 33554432
    local xl, yl = x % base, y % base
    local xh, yh = (x - xl) / base, (y - yl) / base
    local low, middle, high = xl * yl, xh * yl + xl * yh, xh * yh
    local carry = low % base
    middle, low = middle + (low - carry) / base, carry
    carry = middle % base
    high, middle = high + (middle - carry) / base, carry
    return high, middle, low
  end

  -- -1, 0 or 1 as a x b is below, equal to or above c x d (whole numbers below 2^50).
  local function compare_products(a, b, c, d)
    local h1, m1, l1 = product(a, b)
    local h2, m2, l2 = product(c, d)
    if h1 ~= h2 then return h1 < h2 and -1 or 1 end
    if m1 ~= m2 then return m1 < m2 and -1 or 1 end
    if l1 ~= l2 then return l1 < l2 and -1 or 1 end
    return 0
  end

  -- ceil(a x b / c) exactly, for whole a, b, c below 2^50 whose result is below 2^50: the
  -- float quotient is off by at most one either way, and exact products settle it.
  local function ceil_muldiv(a, b, c)
    local q = math.floor(a * b / c)
    while q > 0 and compare_products(q, c, a, b) > 0 do q = q - 1 end
    while compare_products(q + 1, c, a, b) <= 0 do q = q + 1 end
    if compare_products(q, c, a, b) == 0 then return q end
    return q + 1
  end

  local function gcra_retime(key, now, p, old)
    local state = redis.call('GET', key)
    local tat = tonumber(state)
    if tat == nil or tat ~= math.floor(tat) or tat >= 2 ^ 53 then return 0 end
    if old == nil then
      return expire_or_delete(key, tat - now)
    end
    if tat <= now then return expire_or_delete(key, 0) end
    -- Beyond MAX_WINDOW ahead only a corrupt state or a clock far off: bounded so the exact
    -- products below stay within 2^50.
    local ahead = math.min(tat - now, MAX_WINDOW)
    local limit = p.capacity * p.emission
    local moved
    -- ahead x E_new / E_old >= C_new x E_new exactly when ahead >= C_new x E_old.
    if compare_products(ahead, 1, p.capacity, old.emission) >= 0 then
      moved = limit
    else
      moved = ceil_muldiv(ahead, p.emission, old.emission)
    end
    redis.call('SET', key, string.format('%d', now + moved), 'PX', px(moved))
    return 1
  end

  ALGORITHMS['g'].retime = gcra_retime
end

if REFUND then
  ALGORITHMS['g'].refund = function(key, now, p, cost)
    local tat = tonumber(redis.call('GET', key))
    if tat == nil or tat ~= math.floor(tat) or tat >= 2 ^ 53 then return 0 end
    local new = gcra_tat(tat, now, p.capacity * p.emission) - cost * p.emission
    if new <= now then return delete(key) end
    store(key, gcra_commit(key, now, p, new))
    return 1
  end
end
