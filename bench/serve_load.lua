-- wrk script of bench/serve_load.py: rotates over a file of prepared requests and prints one
-- JSON line (prefixed "WRK_JSON ") with latency percentiles, requests and error counts.
--
--   wrk -t 1 -c 16 -d 5s -s bench/serve_load.lua http://127.0.0.1:PORT -- REQUESTS CAP \
--       [HISTOGRAM [RATE]]
--
-- REQUESTS: one request a line, "METHOD<TAB>PATH<TAB>BODY" (BODY empty for GET; a POST body is
-- sent as application/json). CAP: requests per thread after which the thread stops (0: none).
-- HISTOGRAM (optional): a file done() writes the latency histogram to, "MICROSECONDS COUNT" a
-- line, as wrk hands it over: after its coordinated-omission correction (wrk 4 adds, for each
-- request slower than twice the mean interval, the requests a constant-rate client would have
-- sent meanwhile), which bench/serve_load.py undoes for the per-request percentiles.
-- RATE (optional, requests/s per thread; 0 or absent: as fast as the connections go): paced
-- mode. The thread sends on a fixed schedule, slot k at t0 + k / RATE, and done() writes to
-- HISTOGRAM .. ".lag" how late each request left after its slot (ms, one a line).
-- Each thread starts at its own offset in the file, so threads ask for different users/items.
--
-- Pacing. wrk 4.1 calls delay() (when the script defines it) before every request of every
-- connection and waits that many ms (an integer; its timers tick in whole ms), but tells the
-- script neither which connection asks nor what time it is. Wall time comes from LuaJIT's FFI
-- (clock_gettime, CLOCK_MONOTONIC). With no connection id, the schedule is the thread's, not a
-- connection's: each delay() takes the next free slot, previous slot + 1 / RATE, and returns
-- max(0, slot - now). The connections share the slots: a connection whose answer came late
-- takes a slot that is already due and sends at once, so a slow answer does not shift the
-- schedule (coordinated omission) unless every connection is busy; then requests leave late,
-- and the ".lag" file says by how much. Per-connection schedules (slot += connections / RATE)
-- give the same rate but, started together, send in bursts of `connections` requests.
-- delay() is defined only in paced mode: wrk checks once, after init(), whether it exists,
-- and a delay() returning 0 would still cost every request a timer event.

-- setup() and done() run in wrk's main Lua state, init/request/response in each thread's own
local threads = {}
local n_threads = 0

function setup(thread)
  thread:set("thread_id", n_threads)
  n_threads = n_threads + 1
  table.insert(threads, thread)
end

-- per thread (each thread runs its own copy of this file); globals, so done() can read them
answered, non2xx, status5xx, cap, histogram_path = 0, 0, 0, 0, nil
lags = {}                    -- paced mode: ms each request left after its slot
local prepared = {}
local next_index = 1

local function monotonic_clock_ms()
  local ffi = require("ffi")
  ffi.cdef([[
    typedef struct { long tv_sec; long tv_nsec; } serve_load_timespec;
    int clock_gettime(int clock_id, serve_load_timespec *tp);
  ]])
  local ts = ffi.new("serve_load_timespec")
  local CLOCK_MONOTONIC = 1
  return function()
    ffi.C.clock_gettime(CLOCK_MONOTONIC, ts)
    return tonumber(ts.tv_sec) * 1e3 + tonumber(ts.tv_nsec) * 1e-6
  end
end

local function pace(rate)
  local now_ms = monotonic_clock_ms()
  local interval = 1000.0 / rate
  local next_slot = nil
  local slots, first, last = {}, 1, 0      -- slots handed out, not yet sent (a FIFO)

  function delay()
    local now = now_ms()
    local slot = next_slot or now
    next_slot = slot + interval
    last = last + 1
    slots[last] = slot
    -- whole ms, rounded: wrk fires a timer at the first ms tick at or after it is due, so a
    -- request leaves up to ~1 ms early or late; the slots stay where they are, so the rate
    -- does not drift
    return math.max(0, math.floor(slot - now + 0.5))
  end

  local plain_request = request
  function request()
    if first <= last then    -- timers fire in slot order (to within a ms tick): FIFO
      lags[#lags + 1] = now_ms() - slots[first]
      slots[first] = nil
      first = first + 1
    end
    return plain_request()
  end
end

function init(args)
  local path = args[1]
  cap = tonumber(args[2] or "0") or 0
  histogram_path = args[3]
  local rate = tonumber(args[4] or "0") or 0
  for line in io.lines(path) do
    local method, target, body = line:match("^(%u+)\t([^\t]*)\t(.*)$")
    if method then
      local headers = {}
      if method == "POST" then
        headers["Content-Type"] = "application/json"
      else
        body = nil
      end
      prepared[#prepared + 1] = wrk.format(method, target, headers, body)
    end
  end
  if #prepared == 0 then
    error("no requests in " .. tostring(path))
  end
  next_index = ((thread_id or 0) * 7919) % #prepared + 1
  if rate > 0 then
    pace(rate)
  end
end

function request()
  local req = prepared[next_index]
  next_index = next_index % #prepared + 1
  return req
end

function response(status, headers, body)
  answered = answered + 1
  if status < 200 or status > 299 then
    non2xx = non2xx + 1
  end
  if status >= 500 then
    status5xx = status5xx + 1
  end
  if cap > 0 and answered >= cap then
    wrk.thread:stop()
  end
end

function done(summary, latency, requests)
  local non, five, capped = 0, 0, 0
  local lag_lines = {}
  for _, t in ipairs(threads) do
    non = non + (t:get("non2xx") or 0)
    five = five + (t:get("status5xx") or 0)
    local c = t:get("cap") or 0
    if c > 0 and (t:get("answered") or 0) >= c then
      capped = capped + 1
    end
    for _, lag in ipairs(t:get("lags") or {}) do
      lag_lines[#lag_lines + 1] = string.format("%.3f", lag)
    end
  end
  local path = threads[1] and threads[1]:get("histogram_path")
  if path then
    local out = assert(io.open(path, "w"))
    for i = 1, #latency do
      local value, count = latency(i)
      out:write(string.format("%d %d\n", value, count))
    end
    out:close()
    if #lag_lines > 0 then
      out = assert(io.open(path .. ".lag", "w"))
      out:write(table.concat(lag_lines, "\n"), "\n")
      out:close()
    end
  end
  local e = summary.errors
  io.write(string.format(
    'WRK_JSON {"requests": %d, "duration_us": %d, "p50_us": %.1f, "p90_us": %.1f, ' ..
    '"p99_us": %.1f, "max_us": %.1f, "mean_us": %.1f, "errors_status": %d, ' ..
    '"errors_connect": %d, "errors_read": %d, "errors_write": %d, "errors_timeout": %d, ' ..
    '"non2xx": %d, "status_5xx": %d, "capped_threads": %d, "threads": %d}\n',
    summary.requests, summary.duration, latency:percentile(50), latency:percentile(90),
    latency:percentile(99), latency.max, latency.mean, e.status, e.connect, e.read, e.write,
    e.timeout, non, five, capped, n_threads))
end
