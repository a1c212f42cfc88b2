-- Loaded after the prelude by the scripts other than the counting call (retime, refund,
-- lease), which read their clock through this function; the counting call reads it inline
-- (driver.lua), building no function for it on every request.

-- The clock: `text` (microseconds, a whole number; tests pass it) or the server's TIME.
-- Returns now, or nil and an error reply naming ARGV[at].
local function clock(text, at)
  if text == nil or text == '' then
    local t = redis.call('TIME')
    return tonumber(t[1]) * 1000000 + tonumber(t[2]), nil
  end
  local now = whole(text, 0, 2 ^ 53)
  if now == nil then
    return nil, redis.error_reply(ERROR .. 'ARGV[' .. at .. '] now must be whole microseconds, '
      .. 'not ' .. text)
  end
  return now, nil
end
