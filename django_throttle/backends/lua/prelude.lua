-- Shared definitions for the algorithm files that follow and the driver at the end.
--
-- Every argument is checked here, before the first write, so a bad call writes nothing and
-- fails with an error naming the argument (the driver's all-or-nothing promise must hold even
-- for hand-made calls that never went through Python's Limit validation).

-- Fraction of a token forgiven when comparing, so float rounding in rates whose interval is
-- not a whole number of microseconds (7/s) never denies a request that is exactly due.
local TOLERANCE = 1e-9
-- Largest capacity or cost: exact in a double (rates.MAX_COUNT).
local MAX_COUNT = 1000000000
-- Longest an empty bucket may take to fill, in microseconds (rates.MAX_WINDOW, 3660 days):
-- every expiry stays far inside what SET PX / PEXPIRE accept.
local MAX_WINDOW = 3660 * 86400 * 1000000
local ALGORITHMS = {}

local function fail(message)
  return redis.error_reply('django_throttle: ' .. message)
end

-- The whole number in `text` within [low, high], or nil.
local function whole(text, low, high)
  local n = tonumber(text)
  if n == nil or n ~= n or n < low or n > high or n ~= math.floor(n) then return nil end
  return n
end

-- Capacity (tokens), interval (microseconds per token) of one limit, or nil and an error
-- reply naming the bad argument. `at` is the ARGV index of the limit's algorithm name.
local function limit_args(at)
  local algorithm = ALGORITHMS[ARGV[at]]
  if algorithm == nil then
    return nil, nil, nil, fail('ARGV[' .. at .. '] unknown algorithm ' .. tostring(ARGV[at]))
  end
  local capacity = whole(ARGV[at + 1], 1, MAX_COUNT)
  if capacity == nil then
    return nil, nil, nil, fail('ARGV[' .. (at + 1) .. '] capacity must be a whole number in [1, '
      .. MAX_COUNT .. '], not ' .. tostring(ARGV[at + 1]))
  end
  local interval = tonumber(ARGV[at + 2])
  if interval == nil or interval ~= interval or interval <= 0 or interval >= math.huge then
    return nil, nil, nil, fail('ARGV[' .. (at + 2) .. '] interval must be a finite number of '
      .. 'microseconds above 0, not ' .. tostring(ARGV[at + 2]))
  end
  if capacity * interval > MAX_WINDOW then
    return nil, nil, nil, fail('ARGV[' .. (at + 1) .. '..' .. (at + 2) .. '] capacity x interval '
      .. 'must be at most ' .. MAX_WINDOW .. ' microseconds')
  end
  return algorithm, capacity, interval, nil
end

-- Parse "<a> <b>" into two finite numbers; nil for a missing key or corrupt state, which the
-- algorithms then treat as an empty (full) bucket instead of failing every request.
local function two_numbers(state)
  if not state then return nil end
  local space = string.find(state, ' ', 1, true)
  if space == nil then return nil end
  local a = tonumber(string.sub(state, 1, space - 1))
  local b = tonumber(string.sub(state, space + 1))
  if a == nil or b == nil or a ~= a or b ~= b or a == math.huge or a == -math.huge
    or b == math.huge or b == -math.huge then
    return nil
  end
  return a, b
end
