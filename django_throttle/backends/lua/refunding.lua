-- Loaded right after the prelude in the refund scripts only: the algorithm files that follow
-- define their refund functions (see REFUND in the prelude).
REFUND = true

-- Delete `key`, whose state no longer matters: 1 (touched).
delete = function(key)
  redis.call('DEL', key)
  return 1
end

-- What a response's rate limit headers report among KEYS[first .. last] (params[i] parsed
-- by limit_spec) as they stand now, after the refund: each limit decided with cost 0 (a
-- peek: nothing written, no slot taken), the reported one picked as driver.lua picks it (the
-- denying enforced limit with the longest wait, else the enforced, non-quiet one with the
-- fewest tokens left, the first of those; never a shadow limit):
-- {index within first .. last (0: none), remaining (whole tokens), reset_us (rounded up)}.
local function reported(params, first, last, now)
  LEASE = 'peek'  -- a concurrency limit looks for a lease: this one holds no slot
  local pick, pick_remaining, pick_reset, pick_retry, denied = 0, nil, 0, -1, false
  for i = first, last do
    local p = params[i]
    if not p.shadow then
      local ok, remaining, reset, retry = p.algorithm.decide(KEYS[i], now, p, 0)
      if not ok then
        if not denied or retry > pick_retry then
          pick, pick_remaining, pick_reset, pick_retry = i, remaining, reset, retry
        end
        denied = true
      elseif not denied and not p.quiet
          and (pick_remaining == nil or remaining < pick_remaining) then
        pick, pick_remaining, pick_reset = i, remaining, reset
      end
    end
  end
  return {pick == 0 and 0 or pick - first + 1, math.floor(pick_remaining or 0),
    math.ceil(pick_reset)}
end
