-- Concurrency: requests in flight, each holding a lease until it is released. Spec code 'n'.
--
-- Spec "n[!]<capacity>:<lease>": capacity C slots; lease L in whole microseconds
-- (<= MAX_WINDOW): how long a slot stays held unless renewed (lease.lua). A worker killed
-- while it held a slot frees it within L.
--
-- State per key: a sorted set of leases, member the lease id (the driver's LEASE: one per
-- request, made by the caller), score the microsecond the lease ends. Live leases: score >
-- now; one that ended is not counted, whether or not it was trimmed yet. A key of another
-- type reads as nothing held and is replaced on the next write.
-- Decide at now with cost c (a request with c >= 1 takes one slot; c = 0 takes none):
-- count = live leases; a live lease of this request's own id is already held (a repeated
-- acquire takes no second slot); allowed iff it is held or count + 1 <= C.
--   allowed: remaining = C - count - (1 if a slot is taken, else 0), reset = the latest live
--            lease end - now (L when a slot is taken), retry 0; writes: drops ended leases,
--            adds (or moves) this lease to end at now + L, TTL = the latest lease end
--   denied:  remaining = 0, reset = latest end - now, retry = the earliest live end - now,
--            at most RETRY_CAP: a slot frees when a request ends, which no clock tells, so a
--            refused request is told to come back soon, never later than a lease's end
-- Work per request: O(log n) (ZCOUNT, ZSCORE, two ZRANGEs, ZADD); memory O(C) per key.
-- Retime: leases keep their ends; the TTL is re-set to the latest live end (deleted when
-- none is live). A new lease time applies from each lease's next renewal.
-- Refund: nothing (0): a lease is given back by its id (lease.lua), not by a refund.

-- Its commands leave a score or a lease id, longer than a state, in argument position 2.
PLACEHOLDER = true

-- Longest retry told to a request refused by a concurrency limit, in microseconds.
local RETRY_CAP = 1000000

local function lease_parse(capacity, text, now, p)
  local lease = whole(text, 1, MAX_WINDOW)
  if lease == nil then
    return nil, 'lease must be whole microseconds in [1, ' .. MAX_WINDOW .. '], not ' .. text
  end
  p.lease = lease
  return p, nil
end

-- The latest lease end in the set and the earliest after now (nil when there is none).
local function lease_ends(key, now)
  local latest = redis.call('ZRANGE', key, -1, -1, 'WITHSCORES')
  local earliest = redis.call('ZRANGEBYSCORE', key, '(' .. string.format('%d', now), '+inf',
    'WITHSCORES', 'LIMIT', 0, 1)
  return latest[2] and tonumber(latest[2]) or nil, earliest[2] and tonumber(earliest[2]) or nil
end

local function lease_decide(key, now, p, cost)
  local count = redis.pcall('ZCOUNT', key, '(' .. string.format('%d', now), '+inf')
  local replace = false
  if type(count) ~= 'number' then
    count, replace = 0, true  -- not a sorted set: nothing held, replaced on write
  end
  local held = false
  if count > 0 then
    local score = redis.call('ZSCORE', key, LEASE)
    held = score ~= false and score ~= nil and tonumber(score) > now
  end
  local take = cost > 0 and not held
  if held or count + (take and 1 or 0) <= p.capacity then
    local reset = 0
    if cost > 0 then reset = p.lease end
    if count > 0 then
      local latest = lease_ends(key, now)
      if latest and latest - now > reset then reset = latest - now end
    end
    local pending = nil
    if cost > 0 then pending = replace end
    return true, math.max(0, p.capacity - count - (take and 1 or 0)), reset, 0, pending
  end
  local latest, earliest = lease_ends(key, now)
  local retry = math.min(math.max(1, (earliest or now) - now), RETRY_CAP)
  return false, 0, math.max(0, (latest or now) - now), retry, nil
end

local function lease_commit(key, now, p, replace)
  if replace then
    redis.call('DEL', key)
  else
    redis.call('ZREMRANGEBYSCORE', key, '-inf', string.format('%d', now))
  end
  redis.call('ZADD', key, string.format('%d', now + p.lease), LEASE)
  local latest = tonumber(redis.call('ZRANGE', key, -1, -1, 'WITHSCORES')[2])
  redis.call('PEXPIRE', key, px(latest - now))
end

ALGORITHMS['n'] = {
  parse = lease_parse, decide = lease_decide, commit = lease_commit,
}

if RETIME then
  local function lease_retime(key, now)
    local latest = redis.pcall('ZRANGE', key, -1, -1, 'WITHSCORES')
    latest = type(latest) == 'table' and latest[2] and tonumber(latest[2])
    if not latest then return 0 end
    redis.call('ZREMRANGEBYSCORE', key, '-inf', string.format('%d', now))
    return expire_or_delete(key, latest - now)
  end

  ALGORITHMS['n'].retime = lease_retime
end

if REFUND then
  ALGORITHMS['n'].refund = function() return 0 end
end
