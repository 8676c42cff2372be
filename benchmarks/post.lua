-- wrk script: POST a fixed body, with extra headers; print one JSON summary line.
--
-- usage: wrk -s benchmarks/post.lua URL -- BODY_FILE [HEADER_NAME HEADER_VALUE]...
--
-- The body is read once per wrk thread from BODY_FILE, so the request is built
-- once and reused on every keep-alive connection. `done` prints a line
-- starting with "WRKJSON " that benchmarks/load.py parses (latencies in us).

function init(args)
   local path = args[1]
   if path == nil then
      error("post.lua: give the body file after --")
   end
   local fh = assert(io.open(path, "rb"))
   wrk.body = fh:read("*a")
   fh:close()
   wrk.method = "POST"
   wrk.headers["Content-Type"] = "application/json"
   local i = 2
   while args[i] ~= nil and args[i + 1] ~= nil do
      wrk.headers[args[i]] = args[i + 1]
      i = i + 2
   end
end

function done(summary, latency, requests)
   local e = summary.errors
   io.write(string.format(
      "WRKJSON {\"requests\": %d, \"duration_us\": %d, \"bytes\": %d, " ..
      "\"p50_us\": %d, \"p90_us\": %d, \"p99_us\": %d, \"max_us\": %d, \"mean_us\": %.1f, " ..
      "\"errors\": {\"connect\": %d, \"read\": %d, \"write\": %d, \"status\": %d, " ..
      "\"timeout\": %d}}\n",
      summary.requests, summary.duration, summary.bytes,
      latency:percentile(50), latency:percentile(90), latency:percentile(99),
      latency.max, latency.mean,
      e.connect, e.read, e.write, e.status, e.timeout))
end
