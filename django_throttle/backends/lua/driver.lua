-- Check and consume every limit of one request atomically, all-or-nothing. Usage is counted
-- in the calling process, never here (see usage_push.lua).
--
-- KEYS[i]  counter of limit i (i = 1 .. #ARGV - 1); all keys of one call share one hash tag
--          "<prefix>:{<shard>}", so they live in one Redis Cluster slot
-- ARGV[1]  "<op>": "<cost>" to consume (a whole number in [0, 1e9], clamped per limit to its
--          capacity; empty means 1) or "p[<cost>]" to only look: decide as that cost would
--          (none: 0) and write nothing; with "@<now>" appended (whole microseconds) in tests
--          to replace the server clock
-- ARGV[1 + i]  limit i's spec "<code>[!]<capacity>:<parameters>", see limit_spec in the
--          prelude and the algorithm files
-- Reply: one string "<code> <remaining> <reset>[ <retry>| @<now>]", short because it crosses
--        the wire on every request: code = status + 4 x index, status 1 allowed or 0 denied, plus 2
--        when a shadow limit would have denied, index the reported limit (1-based; 0 when no
--        enforced limit was passed); remaining tokens; reset and retry in microseconds (ceil;
--        retry only when denied); an allowed hit (not a peek) with a limit whose refund
--        depends on when it was taken (sliding log, windows, calendar quota: STAMPED) ends
--        with " @<now in base 36>", the microsecond its tokens were taken at, which
--        refund.lua takes to give back exactly what this hit took (buckets and GCRA give
--        back the same whenever: their replies stay short). Or an error naming the first bad argument, with nothing written.
-- Every argument is validated before anything is read or written. Enforced limits are
-- all-or-nothing: nothing is written unless every one allows. A shadow limit that would deny
-- is reported and left unchanged; the others are consumed with the enforced ones. The
-- reported limit is the denying one with the longest wait, else the enforced one with the
-- fewest tokens left; shadow limits are never reported (remaining and reset are then 0).
-- Each algorithm decides on what it read; the writes follow only when every enforced limit
-- allowed, so a denial writes nothing. Every write sets a TTL equal to the time until the
-- state stops mattering (the limit is whole again), at most 3660 days.
local n = #ARGV - 1
local head = ARGV[1] or ''
if #KEYS ~= n then
  return fail('expected ' .. n .. ' keys for ' .. n .. ' limits, got ' .. #KEYS)
end
local op, when = string.match(head, '^([^@]*)@?(.*)$')
local now, err = clock(when, 1)
if err then return err end
local peek_cost = string.match(op, '^p(.*)$')
local peek = peek_cost ~= nil
local cost = 0
if op == '' then
  cost = 1
elseif not peek or peek_cost ~= '' then
  cost = whole(peek_cost or op, 0, MAX_COUNT)
  if cost == nil then
    return fail("ARGV[1] must be 'p' or a cost: a whole number in [0, " .. MAX_COUNT
      .. "] ('p<cost>' peeks at that cost), not " .. ARGV[1])
  end
end
local algorithms, params, shadows = {}, {}, {}
-- Whether a limit's refund depends on when the hit was made (see the reply).
local stamped = false
for i = 1, n do
  local algorithm, p, shadow, bad = limit_spec(1 + i, now)
  if bad then return bad end
  algorithms[i], params[i], shadows[i] = algorithm, p, shadow
  if STAMPED[p.code] then stamped = true end
end

local allowed, shadow_denied = true, 0
local pick, pick_remaining, pick_reset, pick_retry = 0, nil, 0, -1
local pending = {}
for i = 1, n do
  local p, shadow = params[i], shadows[i]
  local c = cost
  if c > p.capacity then c = p.capacity end
  local ok, remaining, reset, retry, write = algorithms[i].decide(KEYS[i], now, p, c)
  if ok then
    pending[i] = write
    if not shadow and allowed and (pick_remaining == nil or remaining < pick_remaining) then
      pick, pick_remaining, pick_reset = i, remaining, reset
    end
  elseif shadow then
    shadow_denied = 2
  else
    if allowed or retry > pick_retry then
      pick, pick_remaining, pick_reset, pick_retry = i, remaining, reset, retry
    end
    allowed = false
  end
end

if allowed and not peek then
  for i = 1, n do
    if pending[i] ~= nil then
      algorithms[i].commit(KEYS[i], now, params[i], pending[i])
    end
  end
end
if allowed then pick_retry = 0 end
local code = (allowed and 1 or 0) + shadow_denied + 4 * pick
if allowed and not peek and stamped then
  return string.format('%d %d %d @%s', code, pick_remaining or 0, math.ceil(pick_reset),
    to36(now))
elseif allowed then
  return string.format('%d %d %d', code, pick_remaining or 0, math.ceil(pick_reset))
end
return string.format('%d %d %d %d', code, pick_remaining or 0, math.ceil(pick_reset),
  math.ceil(pick_retry))
