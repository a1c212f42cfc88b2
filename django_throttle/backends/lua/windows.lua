-- Shared definitions of the window algorithms (fixed window, calendar quota, sliding window
-- log and counter), loaded after the prelude and before their files: a script without them
-- (a token bucket's, a GCRA's) does not build these closures on every call.

local DIGITS36 = '0123456789abcdefghijklmnopqrstuvwxyz'

-- A whole number >= 0 (below 2^53) in base 36: timestamps in stored state take 10 characters
-- instead of 16, which keeps a state small enough for Redis's smallest allocation classes.
-- A number of ten digits (36^9 <= n < 36^10: every microsecond timestamp from 1973 to 2085,
-- what the windows store) is written in one string.char call; digit by digit, each digit
-- made a string of its own and another joined to the rest, the encoding cost a window's
-- counting call a tenth of its server time (docs/explanation/benchmarks.md).
local function to36(n)
  if n >= 101559956668416 and n < 3656158440062976 then
    local d0 = n % 36
    n = (n - d0) / 36
    local d1 = n % 36
    n = (n - d1) / 36
    local d2 = n % 36
    n = (n - d2) / 36
    local d3 = n % 36
    n = (n - d3) / 36
    local d4 = n % 36
    n = (n - d4) / 36
    local d5 = n % 36
    n = (n - d5) / 36
    local d6 = n % 36
    n = (n - d6) / 36
    local d7 = n % 36
    n = (n - d7) / 36
    local d8 = n % 36
    local d9 = (n - d8) / 36
    -- '0'-'9' are bytes 48-57, 'a'-'z' 97-122.
    return string.char(d9 + (d9 < 10 and 48 or 87), d8 + (d8 < 10 and 48 or 87),
      d7 + (d7 < 10 and 48 or 87), d6 + (d6 < 10 and 48 or 87), d5 + (d5 < 10 and 48 or 87),
      d4 + (d4 < 10 and 48 or 87), d3 + (d3 < 10 and 48 or 87), d2 + (d2 < 10 and 48 or 87),
      d1 + (d1 < 10 and 48 or 87), d0 + (d0 < 10 and 48 or 87))
  end
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
