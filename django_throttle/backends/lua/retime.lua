-- Re-time the stored states of one limit after it changed, so each key lives exactly until
-- its state stops mattering under the limit's CURRENT spec.
--
-- KEYS[i]  counters of one limit (any clients); callers batch the keys a SCAN found
-- ARGV[1]  the limit's spec "<code>[!]<capacity>:<parameters>", see limit_spec
-- ARGV[2]  now in whole microseconds, or '' to read the server clock with TIME (tests only)
-- ARGV[3]  the spec before the edit, of the same algorithm, or '' (or absent) when unknown;
--          GCRA uses it to keep the tokens used when its interval changes
-- Reply: number of keys re-timed or deleted (missing or corrupt keys are skipped), or an
--        error naming the bad argument, with nothing written.
-- Without this, a key written under a faster rate expires on the old, shorter TTL and the
-- client gets a full bucket early: lowering a limit would hand out a free burst. What each
-- algorithm keeps is in its file ("Retime").
if #ARGV ~= 2 and #ARGV ~= 3 then
  return redis.error_reply(ERROR .. 'expected 2 or 3 arguments, got ' .. #ARGV)
end
local now, bad = clock(ARGV[2], 2)
if bad then return bad end
local algorithm, params, _, err = limit_spec(1, now)
if err then return err end
local old = nil
if ARGV[3] ~= nil and ARGV[3] ~= '' then
  local _, old_params, _, old_err = limit_spec(3, now)
  if old_err then return old_err end
  if old_params.code ~= params.code then
    return redis.error_reply(ERROR .. 'ARGV[3] old spec must be of the algorithm of ARGV[1] ('
      .. params.code .. '), not ' .. old_params.code)
  end
  old = old_params
end
local touched = 0
for i = 1, #KEYS do
  touched = touched + algorithm.retime(KEYS[i], now, params, old)
end
return touched
