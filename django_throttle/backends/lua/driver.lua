-- Check and consume every limit of one request atomically, all-or-nothing.
--
-- KEYS[i]  counter of limit i; callers put all keys of one request in one hash-tag slot
-- ARGV[1]  now in microseconds, or '' to read the server clock with TIME (tests only pass it)
-- ARGV[2]  cost in tokens, a whole number in [0, 1e9] (clamped per limit to its capacity)
-- ARGV[3]  'hit' to consume, 'peek' to only look
-- ARGV[4 + 4(i-1) ..]  per limit: algorithm name, capacity (whole tokens in [1, 1e9]),
--          interval (microseconds per token, finite, > 0; capacity x interval <= 3660 days),
--          '1' for a shadow limit (counted, never denies) else '0'
-- Reply: {allowed 0|1, index of the reported limit (1-based; 0 when no enforced limit was
--         passed), remaining tokens, reset in microseconds (ceil), retry_after in
--         microseconds (ceil, 0 when allowed), 1 if a shadow limit would have denied else 0}
--         or an error naming the first bad argument, with nothing written.
-- Every argument is validated before anything is read or written. Enforced limits are
-- all-or-nothing: nothing is written unless every one allows. A shadow limit that would deny
-- is reported and left unchanged; the others are consumed with the enforced ones. The
-- reported limit is the denying one with the longest wait, else the enforced one with the
-- fewest tokens left; shadow limits are never reported (remaining and reset are then 0).
-- Every write sets a TTL equal to the time until the state stops mattering (the bucket is
-- full again), at most 3660 days.
if #ARGV ~= 3 + 4 * #KEYS then
  return fail('expected ' .. (3 + 4 * #KEYS) .. ' arguments for ' .. #KEYS .. ' keys, got ' .. #ARGV)
end
local now
if ARGV[1] ~= '' then
  now = tonumber(ARGV[1])
  if now == nil or now ~= now or now < 0 or now >= math.huge then
    return fail('ARGV[1] now must be microseconds or empty, not ' .. ARGV[1])
  end
else
  local t = redis.call('TIME')
  now = tonumber(t[1]) * 1000000 + tonumber(t[2])
end
local cost = whole(ARGV[2], 0, MAX_COUNT)
if cost == nil then
  return fail('ARGV[2] cost must be a whole number in [0, ' .. MAX_COUNT .. '], not '
    .. tostring(ARGV[2]))
end
local peek = ARGV[3] == 'peek'
if not peek and ARGV[3] ~= 'hit' then
  return fail("ARGV[3] mode must be 'hit' or 'peek', not " .. tostring(ARGV[3]))
end
if peek then cost = 0 end

local algorithms, capacities, intervals, shadows = {}, {}, {}, {}
for i = 1, #KEYS do
  local base = 3 + (i - 1) * 4
  local algorithm, capacity, interval, err = limit_args(base + 1)
  if err then return err end
  local flag = ARGV[base + 4]
  if flag ~= '0' and flag ~= '1' then
    return fail('ARGV[' .. (base + 4) .. "] shadow flag must be '0' or '1', not " .. tostring(flag))
  end
  algorithms[i], capacities[i], intervals[i], shadows[i] = algorithm, capacity, interval, flag == '1'
end

local allowed, shadow_denied = true, 0
local pick, pick_remaining, pick_reset, pick_retry = 0, nil, 0, -1
local writes = {}
for i = 1, #KEYS do
  local capacity, shadow = capacities[i], shadows[i]
  local c = cost
  if c > capacity then c = capacity end
  local ok, state, ttl, remaining, reset, retry =
    algorithms[i].decide(redis.call('GET', KEYS[i]), now, capacity, intervals[i], c)
  if ok then
    writes[i] = {state, ttl}
    if not shadow and allowed and (pick_remaining == nil or remaining < pick_remaining) then
      pick, pick_remaining, pick_reset = i, remaining, reset
    end
  elseif shadow then
    shadow_denied = 1
  else
    if allowed or retry > pick_retry then
      pick, pick_remaining, pick_reset, pick_retry = i, remaining, reset, retry
    end
    allowed = false
  end
end

if allowed and not peek then
  for i = 1, #KEYS do
    local w = writes[i]
    if w then
      redis.call('SET', KEYS[i], w[1], 'PX', math.max(1, math.ceil(w[2] / 1000)))
    end
  end
end
if allowed then pick_retry = 0 end
return {allowed and 1 or 0, pick, pick_remaining or 0, math.ceil(pick_reset),
  math.ceil(pick_retry), shadow_denied}
