-- Take one unit of a voucher's stock for a user, atomically, and draw the
-- order's ID. (next_id comes from package idworker, prepended to this
-- script.)
--
-- KEYS[1] stock   (string: units left)
-- KEYS[2] buyers  (set: users who took a unit)
-- KEYS[3] holds   (sorted set: user -> deadline in ms, a unit taken but
--                  not yet turned into an order row)
-- KEYS[4] the day's order-ID sequence
-- ARGV[1] user ID
-- ARGV[2] how long the hold lasts, in ms
-- ARGV[3], ARGV[4] the ID's time part, as idworker.Slot's Hi and Lo
--
-- Returns {0, order ID} taken, {1} sold out, {2} already bought, {3} stock
-- key missing, {4} sold out with holds still open (units that may yet come
-- back), {5} already bought by a request still holding its unit (it may
-- yet fail), {6} the day's ID sequence is exhausted, {7} the day's ID
-- sequence is missing (seed it, then try again). Nothing changes unless {0}.
-- Redis runs a script alone, so no other request can slip in between the
-- check and the decrement: this is what makes "check stock, then take it"
-- safe without a lock.
local stock = redis.call('GET', KEYS[1])
if not stock then
  return {3}
end
if tonumber(stock) <= 0 then
  if redis.call('ZCARD', KEYS[3]) > 0 then
    return {4}
  end
  return {1}
end
if redis.call('SISMEMBER', KEYS[2], ARGV[1]) == 1 then
  if redis.call('ZSCORE', KEYS[3], ARGV[1]) then
    return {5}
  end
  return {2}
end
local id, why = next_id(KEYS[4], ARGV[3], ARGV[4])
if not id then
  if why == 'missing' then
    return {7}
  end
  return {6}
end
redis.call('DECR', KEYS[1])
redis.call('SADD', KEYS[2], ARGV[1])
-- The deadline comes from the Redis server's clock, so that instances
-- whose clocks disagree still agree on when a hold has expired.
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
redis.call('ZADD', KEYS[3], now + tonumber(ARGV[2]), ARGV[1])
return {0, id}
