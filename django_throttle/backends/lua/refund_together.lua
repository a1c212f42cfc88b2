-- Give tokens back to the limits of several counters of one request atomically (the undo of
-- a together.lua call that was allowed, for a reservation whose request does not count):
-- refund.lua over each group of keys, in one call.
--
-- KEYS[i]    counter of limit i (i = 1 .. n, n = #KEYS), as the counting call named them: the
--            groups' keys one group after the other, every key on one node
-- ARGV[1]    cost: the tokens to give back, whole tokens in [0, 1e9], clamped per limit to
--            its capacity
-- ARGV[2]    now in whole microseconds since the Unix epoch (tests), or "" for the server's
--            TIME
-- ARGV[3]    the groups, "<n1>:<taken1>,<n2>:<taken2>,...": group g is the next n_g keys (at
--            least 1 each, summing to n), and taken_g the microsecond its tokens were taken at
--            (refund.lua's ARGV[3]), or nothing when unknown ("<n>:")
-- ARGV[3+i]  limit i's spec "<code>[!]<capacity>:<parameters>", see limit_spec
-- ARGV[4+n]  optional: "<m1>,<m2>,...", how many of each group's limits are given back, its
--            first m_g (whole, in [0, n_g]); the others are only looked at (refund.lua's
--            ARGV[4+n], per group)
-- Reply: without ARGV[4+n], the number of keys given back to (an integer); with it, an array
--        {touched, {index, remaining, reset_us}, ...}: that number, then one triple per group,
--        in order, as refund.lua's reply gives it for that group's limits (index within
--        the group). Or an error naming the first bad argument, with nothing written.
local looking = #ARGV == 4 + #KEYS
if #ARGV ~= 3 + #KEYS and not looking then
  return redis.error_reply(ERROR .. 'expected ' .. (3 + #KEYS) .. ' or ' .. (4 + #KEYS)
    .. ' arguments for ' .. #KEYS .. ' keys, got ' .. #ARGV)
end
local cost = whole(ARGV[1], 0, MAX_COUNT)
if cost == nil then
  return redis.error_reply(ERROR .. 'ARGV[1] cost must be a whole number in [0, ' .. MAX_COUNT
    .. '], not ' .. ARGV[1])
end
local now, err = clock(ARGV[2], 2)
if err then return err end
local takens, sizes, total = {}, {}, 0
for size, taken in string.gmatch(ARGV[3], '([^,:]*):([^,]*)') do
  local k = whole(size, 1, #KEYS)
  local at = nil
  if taken ~= '' then at = whole(taken, 0, 2 ^ 53) end
  if k == nil or (taken ~= '' and at == nil) then total = -1 break end
  for _ = 1, k do takens[#takens + 1] = at or false end
  sizes[#sizes + 1] = k
  total = total + k
end
if total ~= #KEYS then
  return redis.error_reply(ERROR .. 'ARGV[3] groups must be <size>:<taken> pairs whose sizes '
    .. 'sum to ' .. #KEYS .. ', not ' .. ARGV[3])
end
-- Whether limit i is given back (all are without ARGV[4+n]).
local gives = {}
if looking then
  local g, first = 0, 1
  for text in string.gmatch(ARGV[4 + #KEYS], '[^,]+') do
    g = g + 1
    local m = sizes[g] and whole(text, 0, sizes[g])
    if m == nil then g = -1 break end
    for i = first, first + sizes[g] - 1 do gives[i] = i < first + m end
    first = first + sizes[g]
  end
  if g ~= #sizes then
    return redis.error_reply(ERROR .. 'ARGV[' .. (4 + #KEYS) .. '] must say how many of each '
      .. "group's limits are given back, one whole number per group within its size, not "
      .. ARGV[4 + #KEYS])
  end
end
local algorithms, params = {}, {}
for i = 1, #KEYS do
  local algorithm, p, _, bad = limit_spec(3 + i, now)
  if bad then return bad end
  algorithms[i], params[i] = algorithm, p
end
local touched = 0
if cost > 0 then
  for i = 1, #KEYS do
    if not looking or gives[i] then
      touched = touched + algorithms[i].refund(KEYS[i], now, params[i],
        math.min(cost, params[i].capacity), takens[i] or nil)
    end
  end
end
if not looking then return touched end
local reply, first = {touched}, 1
for g = 1, #sizes do
  reply[g + 1] = reported(params, first, first + sizes[g] - 1, now)
  first = first + sizes[g]
end
return reply
