-- Shared definitions of the window algorithms (fixed window, calendar quota, sliding window
-- log and counter), loaded after the prelude and before their files: a script without them
-- (a token bucket's, a GCRA's) does not build these closures on every call.

local DIGITS36 = '0123456789abcdefghijklmnopqrstuvwxyz'

-- A whole number >= 0 (below 2^53) in base 36: timestamps in stored state take 10 characters
-- instead of 16, which keeps a state small enough for Redis's smallest allocation classes.
local function to36(n)
  local out = ''
  repeat
    local digit = n % 36
    out = string.sub(DIGITS36, digit + 1, digit + 1) .. out
    n = (n - digit) / 36
  until n == 0
  return out
end

-- The window counters of a "<count> <start>" or "<cur> <prev> <start>" state (whole counts
-- in decimal, the start in base-36 microseconds), matched by `pattern`: up to three numbers,
-- or nil for a missing key or corrupt state (the algorithms then count nothing used instead
-- of failing every request).
local function window_state(state, pattern)
  if type(state) ~= 'string' then return nil end
  local a, b, c = string.match(state, pattern)
  if a == nil then return nil end
  a, b = tonumber(a), tonumber(b, c and 10 or 36)
  if c then c = tonumber(c, 36) end
  if a >= 2 ^ 53 or b >= 2 ^ 53 or (c and c >= 2 ^ 53) then return nil end
  return a, b, c
end

-- The ':'-separated fields of a spec's `text` (see limit_spec), in a table.
local function split_fields(text)
  local fields = {}
  for field in string.gmatch(text .. ':', '([^:]*):') do
    fields[#fields + 1] = field
  end
  return fields
end

-- A spec's one period field `text`: whole microseconds in [1, MAX_WINDOW], or nil and an
-- error message.
local function period_field(text, what)
  if string.find(text, ':', 1, true) then
    return nil, what .. ' spec must be <capacity>:<period>, not ' .. text
  end
  local period = whole(text, 1, MAX_WINDOW)
  if period == nil then
    return nil, 'period must be whole microseconds in [1, ' .. MAX_WINDOW .. '], not '
      .. text
  end
  return period, nil
end
