-- Async mode: accept an order in Redis, in one atomic step.
--
-- KEYS[1] stock    KEYS[2] buyers   (package stock's keys of the voucher)
-- KEYS[3] the orders stream         KEYS[4] the pending-orders hash
-- KEYS[5] the voucher's accepted orders: user -> order ID
-- KEYS[6] this request's void mark (see lost.lua)
-- KEYS[7] the voucher's count of orders in the stream not yet written
-- ARGV[1] user ID   ARGV[2] voucher ID   ARGV[3] time in ms
-- ARGV[4] the order's ID (drawn by idworker.Pool: a decimal string, as Lua
--         numbers cannot hold 63 bits)
--
-- Returns 0 accepted, 1 sold out, 2 already bought, 3 stock key missing,
-- 8 this request was declared lost before it ran: its caller was already
-- answered.
--
-- Taking the unit, remembering the user and appending the order to the
-- stream in one script means there is no moment at which one has happened
-- without the others: an accepted order cannot be lost between Redis keys.
if redis.call('EXISTS', KEYS[6]) == 1 then
  return 8
end
local stock = redis.call('GET', KEYS[1])
if not stock then
  return 3
end
if tonumber(stock) <= 0 then
  return 1
end
if redis.call('SISMEMBER', KEYS[2], ARGV[1]) == 1 then
  return 2
end
local id = ARGV[4]
redis.call('DECR', KEYS[1])
redis.call('SADD', KEYS[2], ARGV[1])
redis.call('XADD', KEYS[3], '*', 'id', id, 'user', ARGV[1], 'voucher', ARGV[2], 'at', ARGV[3])
redis.call('HSET', KEYS[4], id, ARGV[1] .. ':' .. ARGV[2] .. ':' .. ARGV[3] .. ':pending')
redis.call('HSET', KEYS[5], ARGV[1], id)
redis.call('INCR', KEYS[7])
return 0
