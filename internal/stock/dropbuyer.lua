-- Forget, in their home bucket, a buyer whose order async mode
-- dead-lettered when its unit came from another bucket (see
-- Store.DropBuyer): the dead letter settled the unit there, in its own
-- slot; the buyer lives here.
--
-- KEYS[1] claims, KEYS[2] buyers, KEYS[3] dropped (the home bucket's)
-- ARGV[1] user ID   ARGV[2] the dead-lettered order's ID
--
-- Returns 1 forgotten, 2 a claim is open: the request that queued the
-- order has not yet closed it (the mark tells it to forget the buyer
-- then), 0 done before for this order (a retry, or a second consumer
-- settling the same entry): the user may have bought again since.
--
-- The mark stays after it was read: it is what makes this once per
-- order. A replay of the dead letter, which queues the order again under
-- the same ID, removes it first (Store.Undrop).
if redis.call('HGET', KEYS[3], ARGV[1]) == ARGV[2] then
  return 0
end
redis.call('HSET', KEYS[3], ARGV[1], ARGV[2])
if redis.call('ZSCORE', KEYS[1], ARGV[1]) then
  return 2
end
redis.call('SREM', KEYS[2], ARGV[1])
return 1
