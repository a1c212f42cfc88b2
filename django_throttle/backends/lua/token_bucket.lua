-- Token bucket with continuous, exact refill. Spec code 't'.
--
-- State per key is one string "<used> <timestamp>": tokens taken and not yet refilled
-- (fractional, 16 significant digits) as of timestamp (whole microseconds of the server
-- clock, base 36). At `now`, used has drained by elapsed / interval: refill is continuous and
-- never truncated to whole tokens or seconds. Storing what was used (not what is left, and not
-- a time at which the bucket is full) keeps the state independent of the rate: an operator who
-- raises a limit gives clients the new headroom at once, one who lowers it never hands out a
-- burst (used is capped at capacity: an empty bucket stays empty), and a worker still on the
-- old policy for a few seconds cannot strand a client with a debt measured in the old rate.
--
-- token_bucket(state, now, capacity, interval, cost)
--   state     stored string, or false (missing key = nothing used = full bucket); corrupt
--             state counts as a full bucket
--   now       whole microseconds
--   capacity  tokens (burst)
--   interval  microseconds to earn one token back (period / count)
--   cost      tokens this request takes (0 = peek), at most capacity
-- returns allowed (boolean), new_state (string or nil), ttl_us (until full again, exact),
--         remaining (whole tokens), reset_us (until full again), retry_us (until this request
--         would pass; 0 if allowed); reset_us and retry_us are within the tolerance, so a
--         request at now + ceil(retry_us) passes. Replies are computed from the state as
--         stored (used rounded to 16 digits), so a retry is judged on exactly what was written.
-- Every duration returned is within [0, capacity x interval], whatever the stored state:
-- a timestamp in the future (clock stepped back, another server) counts as no time elapsed.
--
-- token_bucket_ttl(state, now, capacity, interval)
--   microseconds until the stored state no longer matters (the bucket is full) under this
--   capacity and interval, or nil for missing or corrupt state (used by the retime script).

-- Tokens used as of `now`, within [0, capacity]. A stored count above capacity (the burst was
-- lowered, or the state is bad) counts as an empty bucket, which then refills as usual.
local function token_bucket_used(state, now, capacity, interval)
  local used, stamp = number_and_time(state)
  if used == nil then return 0 end
  if used > capacity then used = capacity end
  local elapsed = now - stamp
  -- A clock that stepped back must not mint tokens: clamp negative elapsed time to 0.
  if elapsed < 0 then elapsed = 0 end
  used = used - elapsed / interval
  if used < 0 then return 0 end
  return used
end

local function token_bucket(state, now, capacity, interval, cost)
  local used = token_bucket_used(state, now, capacity, interval)
  local after = used + cost
  -- Reported waits are less half the tolerance the comparison forgives: float noise then
  -- never rounds an exact wait up to the next microsecond (2 s reported as 2.000001 s, a 3 s
  -- Retry-After), and a retry at now + ceil(retry) still has half the tolerance to spare, so
  -- it passes. The TTL is the exact time until full.
  if after <= capacity + TOLERANCE then
    local text = string.format('%.16g', after)
    after = tonumber(text)
    return true, text .. ' ' .. to36(now), after * interval,
      math.max(0, math.floor(capacity - after + TOLERANCE)),
      math.max(0, (after - TOLERANCE / 2) * interval), 0
  end
  return false, nil, 0, math.max(0, math.floor(capacity - used + TOLERANCE)),
    math.max(0, (used - TOLERANCE / 2) * interval),
    math.max(0, (after - capacity - TOLERANCE / 2) * interval)
end

local function token_bucket_ttl(state, now, capacity, interval)
  if number_and_time(state) == nil then return nil end
  return token_bucket_used(state, now, capacity, interval) * interval
end

ALGORITHMS['t'] = {decide = token_bucket, ttl = token_bucket_ttl}
