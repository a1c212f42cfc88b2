-- Read one shard's usage keys for a run of minutes, for reports and the rollup (see usage.lua).
--
-- KEYS     for each minute from ARGV[1] to ARGV[2], in order: its totals hash "<tag>u<minute>"
--          when ARGV[3] is '1', then its five top lists "<tag>t<letter><minute>" (letters
--          a, d, s, o, c) when ARGV[4] is '1'; all of one shard (one hash tag, one slot)
-- ARGV[1]  first minute, ARGV[2] last minute (whole minutes since the Unix epoch)
-- ARGV[3]  '1' to read the totals hashes, ARGV[4] '1' to read the top-client lists
-- Reply: one entry per non-empty key: the minute, then 'u' and field/count pairs for a
--        totals hash, or 't' and the outcome letter, and member/score pairs for a top list,
--        joined by "\0" into one string (cheap to parse for a large report), or as an array
--        of those parts when a name holds a NUL byte itself. Reads only; writes nothing.
local first, last = tonumber(ARGV[1]), tonumber(ARGV[2])
local totals, clients = ARGV[3] == '1', ARGV[4] == '1'
local letters = {'a', 'd', 's', 'o', 'c'}
local per_minute = (totals and 1 or 0) + (clients and #letters or 0)
if first == nil or last == nil or #KEYS ~= (last - first + 1) * per_minute then
  return redis.error_reply('django_throttle: expected ' .. per_minute
    .. ' keys per minute from ARGV[1] to ARGV[2], got ' .. #KEYS)
end
local out = {}
-- parts joined by NUL, unless a name holds one: then the array itself
local function add(head, kind, items)
  local joined = table.concat(items, '\0')
  local _, nuls = string.gsub(joined, '%z', '')
  if nuls == #items - 1 then
    out[#out + 1] = head .. '\0' .. kind .. '\0' .. joined
  else
    table.insert(items, 1, kind)
    table.insert(items, 1, head)
    out[#out + 1] = items
  end
end
local at = 0
for minute = first, last do
  local m = string.format('%d', minute)
  if totals then
    at = at + 1
    local fields = redis.call('HGETALL', KEYS[at])
    if #fields > 0 then add(m, 'u', fields) end
  end
  if clients then
    for _, letter in ipairs(letters) do
      at = at + 1
      local members = redis.call('ZRANGE', KEYS[at], 0, -1, 'WITHSCORES')
      if #members > 0 then add(m, 't' .. letter, members) end
    end
  end
end
return out
