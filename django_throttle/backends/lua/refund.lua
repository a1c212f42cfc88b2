-- Give tokens back to every limit of one request atomically: the undo of a hit that was
-- allowed, for a reservation whose request does not count (see Backend.refund).
--
-- KEYS[i]    counter of limit i (i = 1 .. n, n = #KEYS), as the counting call names it (one
--            hash tag, one slot)
-- ARGV[1]    cost: the tokens to give back, whole tokens in [0, 1e9], clamped per limit to
--            its capacity
-- ARGV[2]    now in whole microseconds since the Unix epoch (tests), or "" for the server's
--            TIME
-- ARGV[3]    taken: the microsecond the refunded hit took its tokens at (its reply's
--            taken_us), or "" when unknown: each algorithm then gives back only what that hit
--            took (a sliding log's entries of that microsecond, a window's count only if the
--            hit was counted in the window stored now), never another request's
-- ARGV[3+i]  limit i's spec "<code>[!]<capacity>:<parameters>", see limit_spec; a shadow
--            limit is refunded like the others: the caller leaves out the ones the hit
--            spared (driver.lua's reply field 6: they would have denied, so took nothing)
-- ARGV[4+n]  optional: m, how many of the limits are given back, the first m (whole, in
--            [0, n]); the others are only looked at (the rest of the limits a response's
--            headers report on, such as the tier's beside a rule's)
-- Reply: without ARGV[4+n], the number of keys given back to (an integer); with it, an array
--        {touched, index, remaining, reset_us}: that number, then what the headers report
--        once the tokens are back (see `reported` in refunding.lua: every one of the n
--        limits looked at with cost 0, nothing more written; index 1-based, 0 when no
--        enforced limit is among them). Or an error naming the first bad argument, with
--        nothing written.
-- Each limit follows its algorithm's "Refund" rule (in its file): its state never goes below
-- nothing used, a missing key stays missing, and every write sets the TTL a hit would.
if #ARGV ~= 3 + #KEYS and #ARGV ~= 4 + #KEYS then
  return redis.error_reply(ERROR .. 'expected ' .. (3 + #KEYS) .. ' or ' .. (4 + #KEYS)
    .. ' arguments for ' .. #KEYS .. ' keys, got ' .. #ARGV)
end
local given = #KEYS
if #ARGV == 4 + #KEYS then
  given = whole(ARGV[4 + #KEYS], 0, #KEYS)
  if given == nil then
    return redis.error_reply(ERROR .. 'ARGV[' .. (4 + #KEYS) .. '] must be how many limits are '
      .. 'given back, a whole number in [0, ' .. #KEYS .. '], not ' .. ARGV[4 + #KEYS])
  end
end
local cost = whole(ARGV[1], 0, MAX_COUNT)
if cost == nil then
  return redis.error_reply(ERROR .. 'ARGV[1] cost must be a whole number in [0, ' .. MAX_COUNT
    .. '], not ' .. ARGV[1])
end
local now, err = clock(ARGV[2], 2)
if err then return err end
local taken = nil
if ARGV[3] ~= '' then
  taken = whole(ARGV[3], 0, 2 ^ 53)
  if taken == nil then
    return redis.error_reply(ERROR .. 'ARGV[3] taken must be whole microseconds, not ' .. ARGV[3])
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
  for i = 1, given do
    touched = touched + algorithms[i].refund(KEYS[i], now, params[i],
      math.min(cost, params[i].capacity), taken)
  end
end
if #ARGV == 3 + #KEYS then return touched end
local shown = reported(params, 1, #KEYS, now)
return {touched, shown[1], shown[2], shown[3]}
