-- Check and consume every limit of one request atomically, all-or-nothing.
--
-- KEYS[i]  counter of limit i; callers put all keys of one request in one hash-tag slot
-- ARGV[1]  now in microseconds, or '' to read the server clock with TIME (tests only pass it)
-- ARGV[2]  cost in tokens (clamped per limit to that limit's capacity)
-- ARGV[3]  'hit' to consume, 'peek' to only look
-- ARGV[4 + 4(i-1) ..]  per limit: algorithm name, capacity (tokens), interval (microseconds),
--          '1' for a shadow limit (counted, never denies) else '0'
-- Reply: {allowed 0|1, index of the reported limit (1-based), remaining tokens,
--         reset in microseconds (ceil), retry_after in microseconds (ceil, 0 when allowed),
--         1 if a shadow limit would have denied else 0}
-- Enforced limits are all-or-nothing: nothing is written unless every one allows. A shadow
-- limit that would deny is reported and left unchanged; the others are consumed with the
-- enforced ones. The reported limit is the denying one with the longest wait, else the
-- enforced one with the fewest tokens left. Every write sets a TTL equal to the time until
-- the state stops mattering (the bucket is full again).
local now
if ARGV[1] ~= '' then
  now = tonumber(ARGV[1])
else
  local t = redis.call('TIME')
  now = tonumber(t[1]) * 1000000 + tonumber(t[2])
end
local cost = tonumber(ARGV[2])
local peek = ARGV[3] == 'peek'
if peek then cost = 0 end

local allowed, shadow_denied = true, 0
local pick, pick_remaining, pick_reset, pick_retry = 1, nil, 0, -1
-- Reported when no enforced limit is (only shadow limits were passed).
local spick, spick_remaining, spick_reset = 1, nil, 0
local writes = {}
for i = 1, #KEYS do
  local base = 3 + (i - 1) * 4
  local algorithm = ALGORITHMS[ARGV[base + 1]]
  if algorithm == nil then
    return redis.error_reply('django_throttle: unknown algorithm ' .. tostring(ARGV[base + 1]))
  end
  local capacity = tonumber(ARGV[base + 2])
  local interval = tonumber(ARGV[base + 3])
  local shadow = ARGV[base + 4] == '1'
  local c = cost
  if c > capacity then c = capacity end
  local ok, state, ttl, remaining, reset, retry =
    algorithm(redis.call('GET', KEYS[i]), now, capacity, interval, c)
  if ok then
    writes[i] = {state, ttl}
    if shadow then
      if spick_remaining == nil or remaining < spick_remaining then
        spick, spick_remaining, spick_reset = i, remaining, reset
      end
    elseif allowed and (pick_remaining == nil or remaining < pick_remaining) then
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
if allowed then
  pick_retry = 0
  if pick_remaining == nil and spick_remaining ~= nil then
    pick, pick_remaining, pick_reset = spick, spick_remaining, spick_reset
  end
end
return {allowed and 1 or 0, pick, pick_remaining or 0, math.ceil(pick_reset),
  math.ceil(pick_retry), shadow_denied}
