-- Admit the next numbers of a voucher's waiting room: in number order, at
-- the room's rate, and never more holding a unit than there are units.
--
-- KEYS[1] who   KEYS[2] pre   KEYS[3] late   KEYS[4] state
-- KEYS[5] admitted   KEYS[6] stock   KEYS[7] joined (join.lua's; not buyers)
-- ARGV[1] begin_time  ARGV[2] end_time (ms)
-- ARGV[3] admit_per_second   ARGV[4] hold_for (ms)
-- ARGV[5] the most to admit in this call (a script blocks Redis while it
--         runs: a long line is admitted over several calls)
--
-- Returns {admitted, serving, free, total, ended, wait...}, or {-1} when
-- the stock key is missing (Redis lost it: reload the voucher first).
-- ended: the holds that ended without an order since the last call, of
-- any instance (each counted once); wait: for each buyer admitted now, the
-- ms they waited, from joining or, drawn, from begin_time.
--
-- The rate is a token bucket kept in the state hash: `credit` grows by
-- admit_per_second a second, up to admit_per_second, and each admission
-- spends one. In any stretch of t seconds at most admit_per_second * (t + 1)
-- are admitted, whichever instances call, and however often.
--
-- The stock is counted in this same script: an admission is made only
-- while a unit is free (stock minus the holds that have not ended), so two
-- instances admitting at once cannot hold one unit twice. A hold that ends
-- without an order frees its unit, here, by no longer counting.
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local serving = tonumber(redis.call('HGET', KEYS[4], 'serving') or '0')
local stock = redis.call('GET', KEYS[6])
if not stock then
  return {-1}
end
local drawn = tonumber(redis.call('HGET', KEYS[4], 'drawn') or '-1')
if drawn < 0 then
  drawn = redis.call('ZCARD', KEYS[2])
end
local total = drawn + tonumber(redis.call('HGET', KEYS[4], 'late') or '0')
local free = tonumber(stock) - redis.call('ZCOUNT', KEYS[5], '(' .. now, '+inf')
if now < tonumber(ARGV[1]) or now >= tonumber(ARGV[2]) then
  return {0, serving, free, total, 0}
end
-- The first call from begin_time on freezes the draw: how many it holds
-- is written down, and join.lua numbers every later join after them,
-- even should Redis' clock step back past begin_time (a failover to a
-- replica whose clock is behind).
redis.call('HSETNX', KEYS[4], 'drawn', drawn)
local swept = tonumber(redis.call('HGET', KEYS[4], 'swept') or '0')
local ended = redis.call('ZCOUNT', KEYS[5], '(' .. swept, now)
local rate = tonumber(ARGV[3])
local credit = rate
local last = tonumber(redis.call('HGET', KEYS[4], 'last') or '-1')
if last >= 0 then
  credit = math.min(rate, tonumber(redis.call('HGET', KEYS[4], 'credit')) + rate * (now - last) / 1000)
end
local admitted, most = 0, tonumber(ARGV[5])
local waits = {}
while credit >= 1 and free > 0 and serving < total and admitted < most do
  local n = serving + 1
  local user, want
  if n <= drawn then
    local m = redis.call('ZRANGE', KEYS[2], n - 1, n - 1)[1]
    local sep = string.find(m, ':', 1, true)
    user, want = string.sub(m, sep + 1), 'p:' .. string.sub(m, 1, sep - 1)
  else
    user, want = redis.call('HGET', KEYS[3], n - drawn), 'l:' .. (n - drawn)
  end
  serving = n
  -- A number whose user has since joined again (a hold that ended) is
  -- theirs no more: passed over, at no cost.
  if redis.call('HGET', KEYS[1], user) == want then
    redis.call('ZADD', KEYS[5], now + tonumber(ARGV[4]), user)
    credit, free, admitted = credit - 1, free - 1, admitted + 1
    local from = tonumber(ARGV[1])
    if n > drawn then
      from = tonumber(redis.call('HGET', KEYS[7], user) or ARGV[1])
    end
    waits[#waits + 1] = now - from
  end
end
redis.call('HSET', KEYS[4], 'serving', serving, 'credit', tostring(credit), 'last', now, 'swept', now)
local out = {admitted, serving, free, total, ended}
for _, w in ipairs(waits) do
  out[#out + 1] = w
end
return out
