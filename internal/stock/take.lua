-- Take one unit of a voucher's stock for a user, atomically.
--
-- KEYS[1] stock   (string: units left)
-- KEYS[2] buyers  (set: users who took a unit)
-- KEYS[3] holds   (sorted set: user -> deadline in ms, a unit taken but
--                  not yet turned into an order row)
-- KEYS[4] claims  (sorted set: user -> deadline in ms, a buyer whose unit
--                  came from another bucket: see buckets.go)
-- KEYS[5] admitted (sorted set: user -> end of their hold in ms, the
--                  buyers a waiting room admitted: package room)
-- ARGV[1] user ID
-- ARGV[2] how long the hold lasts, in ms
-- ARGV[3] '1': the voucher has a waiting room; '' or absent: it has none
--
-- Returns 0 taken, 1 sold out, 2 already bought, 3 stock key missing,
-- 4 sold out with holds still open (units that may yet come back),
-- 5 already bought by a request still holding its unit (it may yet fail),
-- 6 not admitted (a room's voucher, and the user holds no admission that
-- has not ended).
-- Nothing changes unless 0. Every key is the voucher's, in one Redis
-- Cluster slot; the order's ID is drawn apart (idworker.Pool).
-- Redis runs a script alone, so no other request can slip in between the
-- check and the decrement: this is what makes "check stock, then take it"
-- safe without a lock.
local stock = redis.call('GET', KEYS[1])
if not stock then
  return 3
end
-- The buyer before the stock: a buyer of a split voucher whose home bucket
-- is empty must hear "already bought" here, or they would go on to take a
-- unit from another bucket only to give it back when their claim fails,
-- and meanwhile that unit's hold would tell other buyers "sold out".
if redis.call('SISMEMBER', KEYS[2], ARGV[1]) == 1 then
  if redis.call('ZSCORE', KEYS[3], ARGV[1]) or redis.call('ZSCORE', KEYS[4], ARGV[1]) then
    return 5
  end
  return 2
end
-- The deadline comes from the Redis server's clock, so that instances
-- whose clocks disagree still agree on when a hold has expired.
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
-- A room's voucher is sold to admitted buyers only, in this same step:
-- checked apart, an admission could end between the check and the take.
-- The admission stays until the order is confirmed (confirm.lua), so that
-- a request that fails leaves its buyer admitted to try again; the room
-- counts it as a held unit meanwhile, and so admits no one in its place.
if ARGV[3] == '1' then
  local untilMs = redis.call('ZSCORE', KEYS[5], ARGV[1])
  if not untilMs or tonumber(untilMs) <= now then
    return 6
  end
end
if tonumber(stock) <= 0 then
  if redis.call('ZCARD', KEYS[3]) > 0 then
    return 4
  end
  return 1
end
redis.call('DECR', KEYS[1])
redis.call('SADD', KEYS[2], ARGV[1])
redis.call('ZADD', KEYS[3], now + tonumber(ARGV[2]), ARGV[1])
return 0
