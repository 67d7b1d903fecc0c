-- wrk script of bench/serve_load.py: rotates over a file of prepared requests and prints one
-- JSON line (prefixed "WRK_JSON ") with latency percentiles, requests and error counts.
--
--   wrk -t 1 -c 16 -d 5s -s bench/serve_load.lua http://127.0.0.1:PORT -- REQUESTS CAP [HISTOGRAM]
--
-- REQUESTS: one request a line, "METHOD<TAB>PATH<TAB>BODY" (BODY empty for GET; a POST body is
-- sent as application/json). CAP: requests per thread after which the thread stops (0: none).
-- HISTOGRAM (optional): a file done() writes the latency histogram to, "MICROSECONDS COUNT" a
-- line, as wrk hands it over: after its coordinated-omission correction (wrk 4 adds, for each
-- request slower than twice the mean interval, the requests a constant-rate client would have
-- sent meanwhile), which bench/serve_load.py undoes for the per-request percentiles.
-- Each thread starts at its own offset in the file, so threads ask for different users/items.

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
local prepared = {}
local next_index = 1

function init(args)
  local path = args[1]
  cap = tonumber(args[2] or "0") or 0
  histogram_path = args[3]
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
  for _, t in ipairs(threads) do
    non = non + (t:get("non2xx") or 0)
    five = five + (t:get("status5xx") or 0)
    local c = t:get("cap") or 0
    if c > 0 and (t:get("answered") or 0) >= c then
      capped = capped + 1
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
