-- Give tokens back to every limit of one request atomically: the undo of a hit that was
-- allowed, for a reservation whose request does not count (see Backend.refund).
--
-- KEYS[i]  counter of limit i, as the counting call names it (one hash tag, one slot)
-- ARGV[1]  "<cost>[@<now>][#<taken>]": the tokens to give back, a whole number in [0, 1e9]
--          (empty means 1), clamped per limit to its capacity; "@<now>" (whole microseconds)
--          in tests replaces the server clock; "#<taken>" is the microsecond the refunded hit
--          took its tokens at (its reply's "@<now>"): each algorithm then gives back only what
--          that hit took (a sliding log's entries of that microsecond, a window's count only
--          if the hit was counted in the window stored now), never another request's
-- ARGV[1 + i]  limit i's spec "<code>[!]<capacity>:<parameters>", see limit_spec; a shadow
--          limit is refunded like the others (the hit consumed it)
-- Reply: the number of keys given back to, as a string (the counting connection reads bulk
--        strings only), or an error naming the first bad argument, with nothing written.
-- Each limit follows its algorithm's "Refund" rule (in its file): its state never goes below
-- nothing used, a missing key stays missing, and every write sets the TTL a hit would.
if #ARGV ~= 1 + #KEYS then
  return fail('expected ' .. (1 + #KEYS) .. ' arguments for ' .. #KEYS .. ' keys, got ' .. #ARGV)
end
local head, taken_text = string.match(ARGV[1], '^([^#]*)#?(.*)$')
local op, when = string.match(head, '^([^@]*)@?(.*)$')
local now, err = clock(when, 1)
if err then return err end
local taken = nil
if taken_text ~= '' then
  taken = whole(taken_text, 0, 2 ^ 53)
  if taken == nil then
    return fail('ARGV[1] taken must be whole microseconds, not ' .. taken_text)
  end
end
local cost = 1
if op ~= '' then
  cost = whole(op, 0, MAX_COUNT)
  if cost == nil then
    return fail('ARGV[1] must be a cost: a whole number in [0, ' .. MAX_COUNT .. '], not '
      .. ARGV[1])
  end
end
local algorithms, params = {}, {}
for i = 1, #KEYS do
  local algorithm, p, _, bad = limit_spec(1 + i, now)
  if bad then return bad end
  algorithms[i], params[i] = algorithm, p
end
local touched = 0
if cost > 0 then
  for i = 1, #KEYS do
    touched = touched + algorithms[i].refund(KEYS[i], now, params[i],
      math.min(cost, params[i].capacity), taken)
  end
end
return decimal(touched)
