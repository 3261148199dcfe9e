-- Remove a consumer from the group, only if it holds no entry.
--
-- KEYS[1] the orders stream   ARGV[1] the group   ARGV[2] the consumer
--
-- Returns 1 if removed, 0 if it holds entries. XGROUP DELCONSUMER drops
-- the consumer's pending entries with it, and nothing would ever deliver
-- them again: the check and the removal must be one step, or a consumer
-- that read a batch in between would lose it.
local held = redis.call('XPENDING', KEYS[1], ARGV[1], '-', '+', 1, ARGV[2])
if #held > 0 then
  return 0
end
redis.call('XGROUP', 'DELCONSUMER', KEYS[1], ARGV[1], ARGV[2])
return 1
