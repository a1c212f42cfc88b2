-- Loaded right after the prelude in retime.lua's script only: the algorithm files that follow
-- define their retime functions (see RETIME in the prelude).
RETIME = true

-- Set `key`'s expiry to ttl_us, or delete it when its state no longer matters: 1 (touched).
expire_or_delete = function(key, ttl_us)
  if ttl_us <= 0 then
    redis.call('DEL', key)
  else
    redis.call('PEXPIRE', key, px(ttl_us))
  end
  return 1
end
