-- Shared definitions for the algorithm files that follow and the driver at the end.
--
-- Every argument is checked here, before the first write, so a bad call writes nothing and
-- fails with an error naming the argument (the driver's all-or-nothing promise must hold even
-- for hand-made calls that never went through Python's Limit validation).
--
-- Each algorithm file registers ALGORITHMS[<code>] = {
--   stamped = true when its refund gives back what the hit at a given instant took (see
--             refund.lua): an allowed hit of such a limit names its instant in the reply
--             (see driver.lua); absent otherwise
--   parse   = function(capacity, text, now, params) -> params with the algorithm's fields
--             added, or nil and an error message (text: the spec's text after
--             "<code>[!]<capacity>:", its fields separated by ':'; an algorithm of one field
--             reads it whole, without splitting a table out)
--   decide  = function(key, now, params, cost) -> allowed, remaining, reset_us, retry_us,
--             pending (what commit writes; nil: nothing to write). Reads only.
--   commit  = function(key, now, params, pending) -> state, ttl_us: the string the key is
--             SET to and its TTL in microseconds, which the driver stores (see store);
--             nothing when it wrote the key itself (a sorted set), with its TTL
--   retime  = function(key, now, params, old_params_or_nil) -> 1 if the key was re-timed or
--             deleted, 0 if it was missing or corrupt; defined only when RETIME is true
--             (below)
--   refund  = function(key, now, params, cost, taken) -> 1 if cost was given back (the key
--             written with its TTL, or deleted once nothing is used), 0 if it was missing,
--             corrupt or of a window that is no longer the current one (left as it is);
--             taken (or nil: unknown) is the microsecond the refunded hit took its tokens
--             at, so the refund gives back what that hit took and nothing another request
--             took; defined only when REFUND is true (below)
-- }
-- params always holds capacity, code, quiet, algorithm, shadow and the driver's pending; now
-- is whole microseconds; cost is whole tokens,
-- already clamped to the capacity (0 = take nothing).

-- Fraction of a token forgiven when comparing, so float rounding in rates whose interval is
-- not a whole number of microseconds (7/s) never denies a request that is exactly due.
local TOLERANCE = 1e-9
-- Largest capacity or cost: exact in a double (rates.MAX_COUNT).
local MAX_COUNT = 1000000000
-- Longest an empty limit may take to be whole again, in microseconds (rates.MAX_WINDOW,
-- 3660 days): every expiry stays far inside what SET PX / PEXPIRE accept.
local MAX_WINDOW = 3660 * 86400 * 1000000
-- Largest capacity of a sliding window log (rates.MAX_LOG_COUNT): one member per request.
local MAX_LOG_COUNT = 10000
-- Algorithms by their one-letter code in a limit spec (see limit_spec).
local ALGORITHMS = {}
-- True only in refund.lua's script (refunding.lua sets it, and defines `delete`): the
-- algorithm files build their refund functions only then, so the counting script, run on
-- every request, makes no closures it never calls.
local REFUND = false
local delete
-- True only in retime.lua's script (retiming.lua sets it, and defines `expire_or_delete`):
-- likewise, the retime functions (and GCRA's exact arithmetic they need) are built only there.
local RETIME = false
local expire_or_delete
-- The lease id of the request being counted (driver.lua's last argument), under which a
-- concurrency limit holds its slot (concurrency.lua); nil when the call has none.
local LEASE = nil

-- How the package's error replies begin (scripts.SCRIPT_ERROR_PREFIX): each error is
-- redis.error_reply(ERROR .. message), written out where it is returned, since a helper
-- function would be built again on every call (see "The cost of a definition" in
-- docs/explanation/benchmarks.md), like every function a script defines.
local ERROR = 'django_throttle: '
-- A lease id: 1 to 64 letters, digits, '-' or '_' (checked where a lease id comes in).
local LEASE_ID = '^[%w_%-]+$'

-- The whole number in `text` within [low, high], or nil.
local function whole(text, low, high)
  local n = tonumber(text)
  if n == nil or n ~= n or n < low or n > high or n ~= math.floor(n) then return nil end
  return n
end

-- Milliseconds for SET PX / PEXPIRE from a TTL in microseconds: rounded up, at least 1.
local function px(ttl_us)
  return math.max(1, math.ceil(ttl_us / 1000))
end

-- Whether store() writes an empty placeholder before a state. Redis lends a script's command
-- arguments objects cached from earlier commands at the same position, keeping their
-- allocation: a 12-byte state SET right after a longer argument in position 2 kept that
-- argument's 40 or 48 bytes (104-120 bytes per key instead of 88, see
-- docs/explanation/benchmarks.md). A state stored, or a command Redis rewrites for its
-- replicas (EXPIRE, PEXPIRE), takes the object out of circulation, and most of the package's
-- scripts that write end with one of them; an argument another call leaves (the usage push's fields
-- do not: it ends with EXPIRE) costs at most the next state written, once. Within one call,
-- though, a sliding log's or a concurrency limit's reads leave a score or a lease id there
-- for every other limit's state: those files set this, and their scripts store an empty
-- placeholder first, at one command more per write (about a tenth of a token bucket's call,
-- which the other scripts no longer pay).
local PLACEHOLDER = false

-- SET a state string with a TTL of ttl_us (see PLACEHOLDER).
local function store(key, value, ttl_us)
  if PLACEHOLDER then redis.call('SET', key, '') end
  redis.call('SET', key, value, 'PX', math.max(1, math.ceil(ttl_us / 1000)))
end

-- One limit's spec "<code>[!~]<capacity>:<field>[:<field>...]" ('!' marks a shadow limit,
-- '~' a quiet one: enforced, but never the reported limit of an allowed call (the load
-- shedder's fleet capacity, which is no client's own limit: params.quiet);
-- capacity in whole tokens within [1, 1e9]; the fields are the algorithm's, see its file,
-- numbers as tonumber reads them, so 3600000 may come as 36e5: fewer bytes per decision):
-- algorithm, params, shadow, or nil, nil, nil and an error reply naming ARGV[at].
local function limit_spec(at, now)
  local spec = ARGV[at]
  local code, bang, capacity_text, rest = string.match(spec, '^(%l)([!~]?)(%d+):(.+)$')
  local algorithm = code and ALGORITHMS[code]
  if algorithm == nil then
    return nil, nil, nil, redis.error_reply(ERROR .. 'ARGV[' .. at .. '] limit spec must be '
      .. '<algorithm>[!~]<capacity>:<parameters> with a known algorithm, not ' .. tostring(spec))
  end
  -- Digits only (the pattern): whole, and never NaN; no whole() call needed.
  local capacity = tonumber(capacity_text)
  if capacity < 1 or capacity > MAX_COUNT then
    return nil, nil, nil, redis.error_reply(ERROR .. 'ARGV[' .. at .. '] capacity must be a '
      .. 'whole number in [1, ' .. MAX_COUNT .. '], not ' .. capacity_text)
  end
  -- Built with every field the driver sets, so the two or three the algorithm adds fit
  -- without the table growing (each growth allocates its hash part again, on every call).
  local params, message = algorithm.parse(capacity, rest, now, {
    capacity = capacity, code = code, quiet = bang == '~', algorithm = algorithm,
    shadow = bang == '!', pending = false,
  })
  if params == nil then
    return nil, nil, nil, redis.error_reply(ERROR .. 'ARGV[' .. at .. '] ' .. message)
  end
  return algorithm, params, bang == '!', nil
end
