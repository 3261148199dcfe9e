-- Async mode: accept an order in Redis, in one atomic step.
--
-- KEYS[1] stock    KEYS[2] buyers   (package stock's keys of the voucher)
-- KEYS[3] the day's order-ID sequence (icr:order:yyyy:MM:dd)
-- KEYS[4] the orders stream         KEYS[5] the pending-orders hash
-- ARGV[1] user ID   ARGV[2] voucher ID   ARGV[3] time in ms
-- ARGV[4], ARGV[5] the ID's time part (seconds << 32) split as
--         floor(x / 1e9) and x % 1e9: Lua numbers are doubles and cannot
--         hold a 63-bit integer, so the ID is added up in two halves
--
-- Returns {0, order ID} accepted, {1} sold out, {2} already bought,
-- {3} stock key missing, {5} the day's ID sequence is exhausted.
--
-- Taking the unit, remembering the user and appending the order to the
-- stream in one script means there is no moment at which one has happened
-- without the others: an accepted order cannot be lost between Redis keys.
local stock = redis.call('GET', KEYS[1])
if not stock then
  return {3}
end
if tonumber(stock) <= 0 then
  return {1}
end
if redis.call('SISMEMBER', KEYS[2], ARGV[1]) == 1 then
  return {2}
end
local seq = redis.call('INCR', KEYS[3])
if seq > 4294967295 then
  return {5}
end
local lo = tonumber(ARGV[5]) + seq
local hi = tonumber(ARGV[4]) + math.floor(lo / 1000000000)
lo = lo % 1000000000
local id
if hi > 0 then
  id = string.format('%d%09d', hi, lo)
else
  id = string.format('%d', lo)
end
redis.call('DECR', KEYS[1])
redis.call('SADD', KEYS[2], ARGV[1])
redis.call('XADD', KEYS[4], '*', 'id', id, 'user', ARGV[1], 'voucher', ARGV[2], 'at', ARGV[3])
redis.call('HSET', KEYS[5], id, ARGV[1] .. ':' .. ARGV[2] .. ':' .. ARGV[3] .. ':pending')
return {0, id}
