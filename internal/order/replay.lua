-- Async mode: put a dead letter back in the queue, taking its unit again.
--
-- KEYS[1] the dead letters   KEYS[2] the orders stream
-- KEYS[3] the pending-orders hash
-- KEYS[4] stock  KEYS[5] buyers  KEYS[6] accepted  KEYS[7] queued (the
-- voucher's keys)
-- ARGV[1] the dead letter's ID   ARGV[2] order ID   ARGV[3] user ID
-- ARGV[4] voucher ID   ARGV[5] time accepted, in ms
--
-- Returns 0 requeued, 1 sold out, 2 the user holds an order, 3 stock key
-- missing (reload, then try again), 4 no such dead letter (replayed
-- already). Only 0 changes anything: the dead letter stays otherwise.
--
-- The dead letter's settlement gave its unit back and forgot its buyer, so
-- a replay is a new acceptance with the old order ID: the same checks as
-- accept.lua, in one step with taking the entry out of the dead letters.
if #redis.call('XRANGE', KEYS[1], ARGV[1], ARGV[1]) == 0 then
  return 4
end
local stock = redis.call('GET', KEYS[4])
if not stock then
  return 3
end
if tonumber(stock) <= 0 then
  return 1
end
if redis.call('SISMEMBER', KEYS[5], ARGV[3]) == 1 then
  return 2
end
redis.call('DECR', KEYS[4])
redis.call('SADD', KEYS[5], ARGV[3])
redis.call('XADD', KEYS[2], '*', 'id', ARGV[2], 'user', ARGV[3], 'voucher', ARGV[4], 'at', ARGV[5])
redis.call('HSET', KEYS[3], ARGV[2], ARGV[3] .. ':' .. ARGV[4] .. ':' .. ARGV[5] .. ':pending')
redis.call('HSET', KEYS[6], ARGV[3], ARGV[2])
redis.call('INCR', KEYS[7])
redis.call('XDEL', KEYS[1], ARGV[1])
return 0
