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
-- Algorithms by their one-letter code in a limit spec (see limit_spec).
local ALGORITHMS = {}
local DIGITS36 = '0123456789abcdefghijklmnopqrstuvwxyz'

local function fail(message)
  return redis.error_reply('django_throttle: ' .. message)
end

-- The whole number in `text` within [low, high], or nil.
local function whole(text, low, high)
  local n = tonumber(text)
  if n == nil or n ~= n or n < low or n > high or n ~= math.floor(n) then return nil end
  return n
end

-- A whole number >= 0 (below 2^53) in base 36: timestamps in stored state take 10 characters
-- instead of 16, which keeps a state small enough for Redis's 48-byte allocation class.
local function to36(n)
  local out = ''
  repeat
    local digit = n % 36
    out = string.sub(DIGITS36, digit + 1, digit + 1) .. out
    n = (n - digit) / 36
  until n == 0
  return out
end

-- One limit's spec "<code>[!]<capacity>:<interval>" ('!' marks a shadow limit; capacity in
-- whole tokens within [1, 1e9]; interval in microseconds per token, finite, > 0; capacity x
-- interval <= 3660 days): algorithm, capacity, interval, shadow, or nil and an error reply
-- naming ARGV[at].
local function limit_spec(at)
  local spec = ARGV[at]
  local code, bang, capacity_text, interval_text =
    string.match(spec, '^(%l+)(!?)(%d+):([^:]+)$')
  local algorithm = code and ALGORITHMS[code]
  if algorithm == nil then
    return nil, nil, nil, nil, fail('ARGV[' .. at .. '] limit spec must be '
      .. '<algorithm>[!]<capacity>:<interval> with a known algorithm, not ' .. tostring(spec))
  end
  local capacity = whole(capacity_text, 1, MAX_COUNT)
  if capacity == nil then
    return nil, nil, nil, nil, fail('ARGV[' .. at .. '] capacity must be a whole number in [1, '
      .. MAX_COUNT .. '], not ' .. capacity_text)
  end
  local interval = tonumber(interval_text)
  if interval == nil or interval ~= interval or interval <= 0 or interval >= math.huge then
    return nil, nil, nil, nil, fail('ARGV[' .. at .. '] interval must be a finite number of '
      .. 'microseconds above 0, not ' .. interval_text)
  end
  if capacity * interval > MAX_WINDOW then
    return nil, nil, nil, nil, fail('ARGV[' .. at .. '] capacity x interval must be at most '
      .. MAX_WINDOW .. ' microseconds')
  end
  return algorithm, capacity, interval, bang == '!', nil
end

-- The clock: `text` (microseconds, a whole number; tests pass it) or the server's TIME.
-- Returns now, or nil and an error reply naming ARGV[at].
local function clock(text, at)
  if text == nil or text == '' then
    local t = redis.call('TIME')
    return tonumber(t[1]) * 1000000 + tonumber(t[2]), nil
  end
  local now = whole(text, 0, 2 ^ 53)
  if now == nil then
    return nil, fail('ARGV[' .. at .. '] now must be whole microseconds, not ' .. text)
  end
  return now, nil
end

-- Parse "<number> <base-36 timestamp>" into two finite numbers; nil for a missing key or
-- corrupt state, which the algorithms then treat as an empty (full) bucket instead of failing
-- every request.
local function number_and_time(state)
  if not state then return nil end
  local space = string.find(state, ' ', 1, true)
  if space == nil then return nil end
  local a = tonumber(string.sub(state, 1, space - 1))
  local b = tonumber(string.sub(state, space + 1), 36)
  if a == nil or b == nil or a ~= a or a == math.huge or a == -math.huge then
    return nil
  end
  return a, b
end
