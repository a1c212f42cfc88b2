-- wrk script for bench/load_test.py: every request comes from a random client address.
--
--   wrk -s random_xff.lua http://127.0.0.1:8000/api/ping/ -- <pool size>
--
-- Each request carries X-Forwarded-For: 10.a.b.c, drawn uniformly from the first <pool size>
-- addresses of 10.0.0.0/8 (default and maximum 16777216), so the throttles (one trusted proxy)
-- see many distinct clients. done() prints one line "LOADTEST_JSON {...}" with exact counts
-- and latency percentiles in microseconds for load_test.py to parse.

local threads = {}
local next_id = 0

function setup(thread)
  next_id = next_id + 1
  thread:set("id", next_id)
  table.insert(threads, thread)
end

local pool = 16777216

function init(args)
  pool = math.min(tonumber(args[1]) or pool, 16777216)
  -- Each thread has its own Lua state: seed each differently.
  math.randomseed(os.time() * 7919 + (id or 0) * 104729)
end

function request()
  local n = math.random(0, pool - 1)
  local ip = string.format(
    "10.%d.%d.%d", math.floor(n / 65536) % 256, math.floor(n / 256) % 256, n % 256
  )
  return wrk.format(nil, nil, { ["X-Forwarded-For"] = ip })
end

function done(summary, latency, requests)
  local e = summary.errors
  io.write(string.format(
    'LOADTEST_JSON {"requests": %d, "duration_us": %d, "bytes": %d, "connect": %d, '
      .. '"read": %d, "write": %d, "status": %d, "timeout": %d, "p50_us": %d, '
      .. '"p90_us": %d, "p99_us": %d, "max_us": %d, "mean_us": %.1f}\n',
    summary.requests, summary.duration, summary.bytes, e.connect, e.read, e.write,
    e.status, e.timeout, latency:percentile(50), latency:percentile(90),
    latency:percentile(99), latency.max, latency.mean
  ))
end
