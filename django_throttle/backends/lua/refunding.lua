-- Loaded right after the prelude in refund.lua's script only: the algorithm files that follow
-- define their refund functions (see REFUND in the prelude).
REFUND = true

-- Delete `key`, whose state no longer matters: 1 (touched).
delete = function(key)
  redis.call('DEL', key)
  return 1
end
