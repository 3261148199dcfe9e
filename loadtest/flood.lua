-- wrk script for loadtest/flood.sh: every request is POST
-- /seckill/<voucherID> with the next of a file of user tokens, and every
-- answer is kept: the count per status, and the order ID of every 200, so
-- that flood.sh can check each 200 against MySQL afterwards.
--
--   FLOOD_OUT=out.txt wrk -t1 -c700 -d10s --timeout 10s -s loadtest/flood.lua \
--     http://127.0.0.1:18090 -- tokens.txt 42 0
--
-- Arguments after "--": the token file, the voucher ID, and where in the
-- token file to start (so that several wrk processes send different users
-- at first). The results go to the file FLOOD_OUT names: done() runs in
-- wrk's main Lua state, which never sees the arguments.

local tokens = {}
local path = "/"
local counter = 0
statuses = {} -- globals: done() reads them with thread:get
orders = {}

local threads = {}

function setup(thread)
  table.insert(threads, thread)
  thread:set("tid", #threads)
end

function init(args)
  local file, voucher, offset = args[1], args[2], tonumber(args[3] or "0")
  if not file or not voucher then
    error("usage: FLOOD_OUT=<file> wrk ... -s flood.lua <url> -- <token file> <voucher id> [offset]")
  end
  for line in io.lines(file) do
    if #line > 0 then
      tokens[#tokens + 1] = line
    end
  end
  path = "/seckill/" .. voucher
  counter = (offset + (tid - 1) * 7919) % #tokens
end

function request()
  counter = counter + 1
  return wrk.format("POST", path, { ["Authorization"] = "Bearer " .. tokens[(counter % #tokens) + 1] })
end

function response(status, headers, body)
  statuses[status] = (statuses[status] or 0) + 1
  if status == 200 then
    local id = string.match(body, '"order_id":"(%d+)"')
    orders[#orders + 1] = id or "unreadable"
  end
end

function done(summary, latency, requests)
  local f = assert(io.open(os.getenv("FLOOD_OUT") or "/dev/stdout", "w"))
  local total = {}
  for _, t in ipairs(threads) do
    for code, n in pairs(t:get("statuses")) do
      total[code] = (total[code] or 0) + n
    end
    for _, id in ipairs(t:get("orders")) do
      f:write("order ", id, "\n")
    end
  end
  for code, n in pairs(total) do
    f:write(string.format("status %d %d\n", code, n))
  end
  local e = summary.errors
  f:write(string.format("errors connect %d read %d write %d timeout %d status %d\n",
    e.connect, e.read, e.write, e.timeout, e.status))
  f:write(string.format("latency_max_us %d\n", latency.max))
  f:write(string.format("latency_p99_us %d\n", latency:percentile(99)))
  f:write(string.format("requests %d\n", summary.requests))
  f:close()
end
