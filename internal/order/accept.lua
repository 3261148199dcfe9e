-- Async mode: accept an order in Redis, in one atomic step. (next_id comes
-- from package idworker, prepended to this script.)
--
-- KEYS[1] stock    KEYS[2] buyers   (package stock's keys of the voucher)
-- KEYS[3] the day's order-ID sequence (icr:order:yyyy:MM:dd)
-- KEYS[4] the orders stream         KEYS[5] the pending-orders hash
-- KEYS[6] the voucher's accepted orders: user -> order ID
-- KEYS[7] this request's void mark (see lost.lua)
-- KEYS[8] the voucher's count of orders in the stream not yet written
-- ARGV[1] user ID   ARGV[2] voucher ID   ARGV[3] time in ms
-- ARGV[4], ARGV[5] the ID's time part, as idworker.Slot's Hi and Lo
--
-- Returns {0, order ID} accepted, {1} sold out, {2} already bought,
-- {3} stock key missing, {6} the day's ID sequence is exhausted, {7} the
-- day's ID sequence is missing (seed it, then try again), {8} this request
-- was declared lost before it ran: its caller was already answered.
--
-- Taking the unit, remembering the user and appending the order to the
-- stream in one script means there is no moment at which one has happened
-- without the others: an accepted order cannot be lost between Redis keys.
if redis.call('EXISTS', KEYS[7]) == 1 then
  return {8}
end
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
local id, why = next_id(KEYS[3], ARGV[4], ARGV[5])
if not id then
  if why == 'missing' then
    return {7}
  end
  return {6}
end
redis.call('DECR', KEYS[1])
redis.call('SADD', KEYS[2], ARGV[1])
redis.call('XADD', KEYS[4], '*', 'id', id, 'user', ARGV[1], 'voucher', ARGV[2], 'at', ARGV[3])
redis.call('HSET', KEYS[5], id, ARGV[1] .. ':' .. ARGV[2] .. ':' .. ARGV[3] .. ':pending')
redis.call('HSET', KEYS[6], ARGV[1], id)
redis.call('INCR', KEYS[8])
return {0, id}
