-- Give back or renew one request's concurrency leases (see concurrency.lua), by its lease id.
--
-- KEYS[i]    concurrency counter i (i = 1 .. n), as the counting call named it (one hash tag,
--            one slot)
-- ARGV[1]    "release" to give the lease back, "renew" to move its end to now + its lease
-- ARGV[2]    the lease id the counting call took the slots under
-- ARGV[3]    now in whole microseconds since the Unix epoch (tests), or "" for the server's
--            TIME
-- ARGV[3+i]  limit i's lease in whole microseconds, in [1, MAX_WINDOW]
-- Reply: the number of keys whose lease was released or renewed (an integer), or an error
--        naming the first bad argument, with nothing written.
-- Release is idempotent: a lease already released, ended or never taken releases nothing.
-- Renewal never revives a lease: one that ended (score <= now, trimmed or not) may already
-- have been counted free and its slot taken, so it is dropped instead, and one that is
-- missing stays missing (ZADD XX). Every write re-sets the key's TTL to its latest lease end;
-- a key left with no live lease is deleted.
local n = #KEYS
if #ARGV ~= 3 + n then
  return redis.error_reply(ERROR .. 'expected ' .. (3 + n) .. ' arguments for ' .. n
    .. ' keys, got ' .. #ARGV)
end
local op = ARGV[1]
if op ~= 'release' and op ~= 'renew' then
  return redis.error_reply(ERROR .. "ARGV[1] must be 'release' or 'renew', not " .. op)
end
local lease = ARGV[2]
if #lease > 64 or string.match(lease, LEASE_ID) == nil then
  return redis.error_reply(ERROR .. 'ARGV[2] lease id must be 1 to 64 letters, digits, "-" or '
    .. '"_", not ' .. lease)
end
local now, err = clock(ARGV[3], 3)
if err then return err end
local leases = {}
for i = 1, n do
  leases[i] = whole(ARGV[3 + i], 1, MAX_WINDOW)
  if leases[i] == nil then
    return redis.error_reply(ERROR .. 'ARGV[' .. (3 + i) .. '] lease must be whole '
      .. 'microseconds in [1, ' .. MAX_WINDOW .. '], not ' .. ARGV[3 + i])
  end
end

-- Drop ended leases; TTL = the latest live end, or the key deleted when none is live.
local function settle(key)
  redis.call('ZREMRANGEBYSCORE', key, '-inf', string.format('%d', now))
  local latest = redis.call('ZRANGE', key, -1, -1, 'WITHSCORES')[2]
  if latest == nil then
    redis.call('DEL', key)
  else
    redis.call('PEXPIRE', key, px(tonumber(latest) - now))
  end
end

local touched = 0
for i = 1, n do
  local key = KEYS[i]
  local score = redis.pcall('ZSCORE', key, lease)
  if type(score) == 'string' then
    if op == 'release' or tonumber(score) <= now then
      redis.call('ZREM', key, lease)
      if op == 'release' and tonumber(score) > now then touched = touched + 1 end
    else
      redis.call('ZADD', key, 'XX', string.format('%d', now + leases[i]), lease)
      touched = touched + 1
    end
    settle(key)
  end
end
return touched
