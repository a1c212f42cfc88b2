-- The package's counting call for one token-bucket limit, written flat: the same arguments
-- (KEYS[1]; ARGV cost, peek, spec "t<capacity>:<interval>"), the same checks, the same state
-- (12 or 14 bytes, see django_throttle/backends/lua/token_bucket.lua), the same single SET
-- per write (no placeholder, as in the package's token-bucket script: see PLACEHOLDER in its
-- prelude) and the same four-integer reply of an allowed hit, but no function, no algorithm
-- table and no per-limit table: what the counting call would cost if it were written for
-- this one algorithm and one limit. bench_script_mix.py times it beside the package's script
-- and the minimal bucket (bench_paths.MINIMAL_BUCKET): the difference to the package's script
-- is what the shared driver (seven algorithms, any mix of limits in one call) costs per call.
local TOLERANCE = 1e-9
if #KEYS ~= 1 or #ARGV ~= 3 then return redis.error_reply('flat: one key, three arguments') end
local cost = tonumber(ARGV[1])
if cost == nil or cost ~= cost or cost < 0 or cost > 1e9 or cost ~= math.floor(cost) then
  return redis.error_reply('flat: ARGV[1] cost')
end
if ARGV[2] ~= '0' and ARGV[2] ~= '1' then return redis.error_reply('flat: ARGV[2] peek') end
local peek = ARGV[2] == '1'
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local code, capacity_text, rest = string.match(ARGV[3], '^(%l)(%d+):(.+)$')
local capacity = tonumber(capacity_text)
if code ~= 't' or capacity == nil or capacity < 1 or capacity > 1e9
    or capacity ~= math.floor(capacity) or string.find(rest, ':', 1, true) then
  return redis.error_reply('flat: ARGV[3] spec')
end
local interval = tonumber(rest)
if interval == nil or interval ~= interval or interval <= 0 or interval >= math.huge
    or capacity * interval > 3660 * 86400 * 1000000 then
  return redis.error_reply('flat: ARGV[3] interval')
end
if cost > capacity then cost = capacity end
local key = KEYS[1]
local state = redis.call('GET', key)
local used, stamp_ms, low, high = 0, nil, nil, 0
if type(state) == 'string' and #state == 12 then
  used, low = struct.unpack('>dI4', state)
  local now_ms = math.floor(now / 1000)
  local d = (now_ms - low) % 4294967296
  if d >= 2147483648 then d = d - 4294967296 end
  stamp_ms = now_ms - d
elseif type(state) == 'string' and #state == 14 then
  used, low, high = struct.unpack('>dI4I2', state)
  stamp_ms = high * 4294967296 + low
end
if stamp_ms == nil or used ~= used or used == math.huge or used == -math.huge then
  used = 0
else
  local full = capacity + TOLERANCE
  used = math.min(used, full) - math.max(now - stamp_ms * 1000, -999) / interval
  used = math.max(0, math.min(used, full))
end
local after = used + cost
local longest = capacity * interval
if after > capacity + TOLERANCE then
  return {0, 1, math.max(0, math.floor(capacity - used + TOLERANCE)),
    math.ceil(math.min(longest, math.max(0, (used - TOLERANCE / 2) * interval))),
    math.ceil(math.min(cost * interval, math.max(0, (after - capacity - TOLERANCE / 2) * interval)))}
end
if not peek and after > 0 then
  local stamp = math.ceil(now / 1000)
  local kept = after - (stamp * 1000 - now) / interval
  local stamp_low = stamp % 4294967296
  local value
  if longest <= 2e12 then
    value = struct.pack('>dI4', kept, stamp_low)
  else
    value = struct.pack('>dI4I2', kept, stamp_low, (stamp - stamp_low) / 4294967296)
  end
  redis.call('SET', key, value, 'PX', math.max(1, math.ceil(after * interval / 1000)))
end
return {1, 1, math.max(0, math.floor(capacity - after + TOLERANCE)),
  math.ceil(math.min(longest, math.max(0, (after - TOLERANCE / 2) * interval)))}
