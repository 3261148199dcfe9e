-- wrk script for the seckill reject path: every request is
-- POST /seckill/<voucherID> with the next of a file of pre-generated
-- tokens (loadtest/tokens), so that requests come from many users, as in
-- a sale, and not from one.
--
--   wrk -t2 -c64 -d5s -s loadtest/reject.lua http://127.0.0.1:18080 -- /tmp/tokens.txt 42
--
-- Arguments after "--": the token file, one token per line, the voucher
-- ID, and optionally wrk's thread count (-t): given it, the threads share
-- the file out, thread k sending tokens k, k+T, k+2T, ..., so that no user
-- is sent twice until the file is used up (loadtest/success.sh, where a
-- repeated user would be an already_ordered instead of an order). Without
-- it each thread walks the whole file from its own start. With WRK_COUNT=1 in the environment it also counts the
-- response statuses and prints them at the end; that costs the client CPU,
-- so timed runs leave it off and a short check run turns it on.
--
-- A fourth argument sets the path, a format with the voucher ID's %d:
-- "/vouchers/%d/room" makes every request a waiting room's join
-- (loadtest/room.sh). The default is "/seckill/%d".

local tokens = {}
local path = "/"
local counter = 0
local step = 1
statuses = {} -- global: done() reads it with thread:get

local thread_count = 0
local threads = {}

function setup(thread)
  thread_count = thread_count + 1
  thread:set("tid", thread_count)
  table.insert(threads, thread)
end

function init(args)
  local file, voucher = args[1], args[2]
  if not file or not voucher then
    error("usage: wrk ... -s reject.lua <url> -- <token file> <voucher id>")
  end
  for line in io.lines(file) do
    if #line > 0 then
      tokens[#tokens + 1] = line
    end
  end
  if #tokens == 0 then
    error("no tokens in " .. file)
  end
  path = string.format(args[4] or "/seckill/%d", tonumber(voucher))
  local threads = tonumber(args[3])
  if threads then
    step = threads
    counter = tid - 1 - step -- the first request sends token tid
  else
    -- Threads start at different places in the file, so that two threads
    -- rarely send the same user at the same moment.
    counter = ((tid - 1) * 7919) % #tokens
  end
end

function request()
  counter = counter + step
  local token = tokens[(counter % #tokens) + 1]
  return wrk.format("POST", path, { ["Authorization"] = "Bearer " .. token })
end

if os.getenv("WRK_COUNT") == "1" then
  function response(status, headers, body)
    statuses[status] = (statuses[status] or 0) + 1
  end

  function done(summary, latency, requests)
    local total = {}
    for _, t in ipairs(threads) do
      -- thread:get copies the table out of the thread's Lua state.
      local s = t:get("statuses")
      for code, n in pairs(s) do
        total[code] = (total[code] or 0) + n
      end
    end
    for code, n in pairs(total) do
      io.write(string.format("status %d: %d\n", code, n))
    end
  end
end
