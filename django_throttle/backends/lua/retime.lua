-- Re-time the expiry of stored states after their limit changed, so each key lives exactly
-- until its bucket is full under the limit's CURRENT capacity and interval.
--
-- KEYS[i]  counters of one limit (any clients); callers batch the keys a SCAN found
-- ARGV[1]  the limit's spec "<algorithm>[!]<capacity>:<interval>", see limit_spec
-- ARGV[2]  now in whole microseconds, or '' to read the server clock with TIME (tests only)
-- Reply: number of keys whose expiry was set (missing or corrupt keys are skipped), or an
--        error naming the bad argument, with nothing written.
-- Without this, a key written under a faster rate expires on the old, shorter TTL and the
-- client gets a full bucket early: lowering a limit would hand out a free burst.
if #ARGV ~= 2 then
  return fail('expected 2 arguments, got ' .. #ARGV)
end
local algorithm, capacity, interval, _, err = limit_spec(1)
if err then return err end
local now, bad = clock(ARGV[2], 2)
if bad then return bad end
local touched = 0
for i = 1, #KEYS do
  local ttl = algorithm.ttl(redis.call('GET', KEYS[i]), now, capacity, interval)
  if ttl ~= nil then
    redis.call('PEXPIRE', KEYS[i], math.max(1, math.ceil(ttl / 1000)))
    touched = touched + 1
  end
end
return touched
