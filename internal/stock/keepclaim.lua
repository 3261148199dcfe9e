-- Close a claim once async mode queued its order with a unit of another
-- bucket (see Store.KeepClaim), and remember the buyer.
--
-- KEYS[1] claims, KEYS[2] buyers, KEYS[3] dropped (the home bucket's)
-- ARGV[1] user ID   ARGV[2] the claim's deadline ('': whichever claim the
--         user has: the sweeper's, closing an expired one)
-- ARGV[3] the order's ID
--
-- Returns 1 kept, 0 another request's claim is open (left alone), 2 the
-- order was dead-lettered meanwhile (the buyer is forgotten instead).
--
-- The claim is this request's only if its deadline is the one it was
-- given: a request that stalled past it may find a newer request's claim
-- of the same user (the sweeper forgot the first), which is not its to
-- close. With no claim at all (swept, or lost with a failover) the buyer
-- is remembered all the same: their order is queued.
local d = redis.call('ZSCORE', KEYS[1], ARGV[1])
if d and ARGV[2] ~= '' and tonumber(d) ~= tonumber(ARGV[2]) then
  return 0
end
if d then
  redis.call('ZREM', KEYS[1], ARGV[1])
end
if redis.call('HGET', KEYS[3], ARGV[1]) == ARGV[3] then
  redis.call('SREM', KEYS[2], ARGV[1])
  return 2
end
redis.call('SADD', KEYS[2], ARGV[1])
return 1
