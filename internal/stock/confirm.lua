-- Close a hold (or a claim) whose order row is committed.
--
-- KEYS[1] holds (or claims), KEYS[2] buyers (of the same bucket)
-- KEYS[3] the waiting room's admitted buyers (of the same bucket: empty
--         without a room)
-- ARGV[1] user ID
-- ARGV[2] '1': remember the user as a buyer here (their home bucket), in
--         case a reload from MySQL forgot them while the order was being
--         written; '0': not here (a unit taken from another bucket)
--
-- Returns 1 if the hold was still open, 0 if not (the sweeper closed it,
-- or Redis lost it). One script rather than MULTI: the same atomicity, and
-- a script, unlike a transaction, can share a round trip with the commands
-- of other requests (package autopipe).
local removed = redis.call('ZREM', KEYS[1], ARGV[1])
if ARGV[2] == '1' then
  redis.call('SADD', KEYS[2], ARGV[1])
  -- The order is written: a room's hold on the unit ends here. Its
  -- entry stays, ended (score 0), not removed: if the buyer is forgotten
  -- later, their place reads as a hold that ended, and they may join the
  -- room again, rather than waiting for a turn that has passed.
  redis.call('ZADD', KEYS[3], 'XX', 0, ARGV[1])
end
return removed
