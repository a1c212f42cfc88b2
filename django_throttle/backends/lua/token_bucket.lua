-- Token bucket with continuous, exact refill.
--
-- State per key is one string "<used> <timestamp>": tokens taken and not yet refilled
-- (fractional) as of timestamp (microseconds, server clock). At `now`, used has drained by
-- elapsed / interval: refill is continuous and never truncated to whole tokens or seconds.
-- Storing what was used (not what is left) keeps full double precision in the fraction, and
-- means an operator who raises a limit gives clients the new headroom at once.
--
-- token_bucket(state, now, capacity, interval, cost)
--   state     stored string, or false (missing key = nothing used = full bucket)
--   now       microseconds
--   capacity  tokens (burst)
--   interval  microseconds to earn one token back (period / count)
--   cost      tokens this request takes (0 = peek)
-- returns allowed (boolean), new_state (string or nil), ttl_us, remaining (whole tokens),
--         reset_us (until full again), retry_us (until this request would pass; 0 if allowed)
local function token_bucket(state, now, capacity, interval, cost)
  local used = 0
  if state then
    local space = string.find(state, ' ', 1, true)
    local elapsed = now - tonumber(string.sub(state, space + 1))
    -- A clock that stepped back must not mint tokens: clamp negative elapsed time to 0.
    if elapsed < 0 then elapsed = 0 end
    used = math.max(0, tonumber(string.sub(state, 1, space - 1)) - elapsed / interval)
  end
  local after = used + cost
  if after <= capacity + TOLERANCE then
    local refill = after * interval
    return true, string.format('%.17g %.17g', after, now), refill,
      math.max(0, math.floor(capacity - after + TOLERANCE)), refill, 0
  end
  return false, nil, 0, math.max(0, math.floor(capacity - used + TOLERANCE)), used * interval,
    (after - capacity) * interval
end

ALGORITHMS['token_bucket'] = token_bucket
