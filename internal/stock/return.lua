-- Put back the unit of an order that was cancelled or refunded, once.
--
-- KEYS[1] the bucket's stock   KEYS[2] the orders returned to the bucket
-- ARGV[1] the order ID
--
-- Returns 1 the unit is back, 0 it was put back before (or counted by a
-- reload from MySQL: stock.Store.Load), 3 the stock key is missing: nothing
-- changed, and the return is made again after the reload.
--
-- The check and the add are one step: two instances returning the same
-- order at once, or one retrying after a lost answer, add one unit.
if redis.call('EXISTS', KEYS[1]) == 0 then
  return 3
end
if redis.call('SADD', KEYS[2], ARGV[1]) == 0 then
  return 0
end
redis.call('INCR', KEYS[1])
return 1
