-- Check and consume the limits of several counters of one request (a login counted by its
-- client, its IP address and its username) atomically, all or nothing across them: nothing
-- is written unless every counter allows. Each counter is decided as driver.lua decides one
-- call, on the state before any write. Usage is counted in the calling process.
--
-- KEYS[i]    counter of limit i (i = 1 .. n, n = #KEYS): the groups' keys one group after the
--            other, all under one hash tag (the caller sends the groups together only then),
--            so in one Redis Cluster slot
-- ARGV[1]    cost: whole tokens in [0, 1e9], clamped per limit to its capacity
-- ARGV[2]    the groups' sizes, "<n1>,<n2>,...": group g is the next n_g keys (each at least
--            1, summing to n)
-- ARGV[2+i]  limit i's spec "<code>[!~]<capacity>:<parameters>", see limit_spec in the
--            prelude; no concurrency limit (a call taking slots is made alone, see driver.lua)
-- ARGV[3+n]  optional: now in whole microseconds since the Unix epoch (tests); absent or ""
--            for the server's TIME
-- Reply: one array per group, in order: driver.lua's reply for that group's limits (its
-- index and spared ones within the group), with nothing written unless every group
-- allowed; taken_us is set only when every group allowed, and a group that allowed beside
-- one that denied took nothing.
-- Or an error naming the first bad argument, with nothing written.
local n, argc = #KEYS, #ARGV
if argc < 2 + n or argc > 3 + n then
  return redis.error_reply(ERROR .. 'expected ' .. (2 + n) .. ' to ' .. (3 + n)
    .. ' arguments for ' .. n .. ' keys, got ' .. argc)
end
local cost = tonumber(ARGV[1])
if cost == nil or cost ~= cost or cost < 0 or cost > MAX_COUNT or cost ~= math.floor(cost) then
  return redis.error_reply(ERROR .. 'ARGV[1] cost must be a whole number in [0, ' .. MAX_COUNT
    .. '], not ' .. ARGV[1])
end
local sizes, total = {}, 0
for size in string.gmatch(ARGV[2], '[^,]+') do
  local k = whole(size, 1, n)
  if k == nil then total = -1 break end
  sizes[#sizes + 1] = k
  total = total + k
end
if total ~= n or #sizes == 0 then
  return redis.error_reply(ERROR .. 'ARGV[2] group sizes must be whole numbers of at least 1 '
    .. 'summing to ' .. n .. ', not ' .. ARGV[2])
end
local now = ARGV[3 + n]
if now == nil or now == '' then
  local t = redis.call('TIME')
  now = tonumber(t[1]) * 1000000 + tonumber(t[2])
else
  local text = now
  now = whole(text, 0, 2 ^ 53)
  if now == nil then
    return redis.error_reply(ERROR .. 'ARGV[' .. (3 + n) .. '] now must be whole microseconds, '
      .. 'not ' .. text)
  end
end
local params = {}
for i = 1, n do
  local _, p, _, bad = limit_spec(2 + i, now)
  if bad then return bad end
  if p.code == 'n' then
    return redis.error_reply(ERROR .. 'ARGV[' .. (2 + i) .. '] is a concurrency limit: count it '
      .. 'alone (driver.lua), under a lease id')
  end
  params[i] = p
end

-- Each group decided as driver.lua decides its call; its reply's fields kept until the
-- writes are known.
local every = true
local groups = {}
local first = 1
for g = 1, #sizes do
  local last = first + sizes[g] - 1
  local allowed, spared, stamped = true, 0, false
  local pick, pick_remaining, pick_reset, pick_retry = 0, nil, 0, -1
  local wait = 0
  for i = first, last do
    local p = params[i]
    local shadow = p.shadow
    local c = cost
    if c > p.capacity then c = p.capacity end
    if p.algorithm.stamped then stamped = true end
    local ok, remaining, reset, retry, write, delay = p.algorithm.decide(KEYS[i], now, p, c)
    if ok then
      p.pending = write
      if delay and not shadow and delay > wait then wait = delay end
      if not shadow and not p.quiet and allowed
          and (pick_remaining == nil or remaining < pick_remaining) then
        pick, pick_remaining, pick_reset = i - first + 1, remaining, reset
      end
    elseif shadow then
      p.pending = nil
      spared = spared == 0 and tostring(i - first + 1) or spared .. ',' .. (i - first + 1)
    else
      if allowed or retry > pick_retry then
        pick, pick_remaining, pick_reset, pick_retry = i - first + 1, remaining, reset, retry
      end
      allowed = false
    end
  end
  if not allowed then every = false end
  groups[g] = {allowed, pick, pick_remaining, pick_reset, pick_retry, spared, stamped, wait}
  first = last + 1
end

if every then
  for i = 1, n do
    local p = params[i]
    if p.pending ~= nil then
      local key = KEYS[i]
      local state, ttl_us = p.algorithm.commit(key, now, p, p.pending)
      if state ~= nil then
        if PLACEHOLDER then redis.call('SET', key, '') end
        redis.call('SET', key, state, 'PX', math.max(1, math.ceil(ttl_us / 1000)))
      end
    end
  end
end

local replies = {}
for g = 1, #groups do
  local allowed, pick, pick_remaining, pick_reset, pick_retry, spared, stamped, wait =
    unpack(groups[g])
  if allowed then pick_retry = 0 else wait = 0 end
  local taken = 0
  if every and stamped then taken = now end
  local reply = {allowed and 1 or 0, pick, math.floor(pick_remaining or 0), math.ceil(pick_reset),
    math.ceil(pick_retry), spared, taken, math.ceil(wait)}
  local size = 8
  while size > 4 and reply[size] == 0 do
    reply[size] = nil
    size = size - 1
  end
  replies[g] = reply
end
return replies
