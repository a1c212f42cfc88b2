-- Re-time the expiry of stored states after their limit changed, so each key lives exactly
-- until its bucket is full under the limit's CURRENT capacity and interval.
--
-- KEYS[i]  counters of one limit (any clients); callers batch the keys a SCAN found
-- ARGV[1]  algorithm name
-- ARGV[2]  capacity (whole tokens in [1, 1e9])
-- ARGV[3]  interval (microseconds per token, finite, > 0; capacity x interval <= 3660 days)
-- ARGV[4]  now in microseconds, or '' to read the server clock with TIME (tests only pass it)
-- Reply: number of keys whose expiry was set (missing or corrupt keys are skipped), or an
--        error naming the bad argument, with nothing written.
-- Without this, a key written under a faster rate expires on the old, shorter TTL and the
-- client gets a full bucket early: lowering a limit would hand out a free burst.
if #ARGV ~= 4 then
  return fail('expected 4 arguments, got ' .. #ARGV)
end
local algorithm, capacity, interval, err = limit_args(1)
if err then return err end
local now
if ARGV[4] ~= '' then
  now = tonumber(ARGV[4])
  if now == nil or now ~= now or now < 0 or now >= math.huge then
    return fail('ARGV[4] now must be microseconds or empty, not ' .. ARGV[4])
  end
else
  local t = redis.call('TIME')
  now = tonumber(t[1]) * 1000000 + tonumber(t[2])
end
local touched = 0
for i = 1, #KEYS do
  local ttl = algorithm.ttl(redis.call('GET', KEYS[i]), now, capacity, interval)
  if ttl ~= nil then
    redis.call('PEXPIRE', KEYS[i], math.max(1, math.ceil(ttl / 1000)))
    touched = touched + 1
  end
end
return touched
