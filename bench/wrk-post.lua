-- wrk script of bench/serve.sh and bench/serve-lanes.sh: POSTs the JSON
-- body in the file named by $WRK_BODY and, when done, prints one line
-- "RESULT requests requests/s p50_ms p99_ms errors" (errors: non-2xx and
-- socket errors) for the scripts to read.
local f = assert(io.open(os.getenv("WRK_BODY"), "rb"))
wrk.method = "POST"
wrk.body = f:read("*a")
f:close()
wrk.headers["Content-Type"] = "application/json"

function done(summary, latency, requests)
  local e = summary.errors
  io.write(string.format("RESULT %d %.1f %.3f %.3f %d\n", summary.requests,
    summary.requests / (summary.duration / 1e6), latency:percentile(50) / 1e3,
    latency:percentile(99) / 1e3, e.status + e.connect + e.read + e.write + e.timeout))
end
