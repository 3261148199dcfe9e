-- Async mode: move an accepted order that MySQL will never take to the
-- dead letters, and settle what its acceptance took in Redis, in one step.
--
-- KEYS[1] the orders stream    KEYS[2] the dead letters
-- KEYS[3] the pending-orders hash
-- KEYS[4] stock  KEYS[5] buyers  KEYS[6] accepted  KEYS[7] queued (the
--         voucher's keys; absent when the entry names no voucher)
-- ARGV[1] the group   ARGV[2] the entry's ID   ARGV[3] the order ID ('' if none)
-- ARGV[4] user ID ('' if none)
-- ARGV[5] what to do with the unit: 'back' (give it back: MySQL never took
--         it), 'drop' (MySQL has none left: Redis counted one too many)
-- ARGV[6] what to do with the buyer: 'forget' (may buy again), 'keep' (holds
--         another order)
-- ARGV[7...] the dead letter's fields and values
--
-- Returns 1, or 0 if the entry was settled already (by another consumer
-- that claimed it meanwhile): XACK answers 1 only once, so the unit is
-- given back at most once, and the dead letter written once.
--
-- Every key is the shard's: the stream's and the voucher's share the
-- shard's hash tag, so on Redis Cluster the script runs in one slot.
if redis.call('XACK', KEYS[1], ARGV[1], ARGV[2]) == 0 then
  return 0
end
local fields = {}
for i = 7, #ARGV do
  fields[#fields + 1] = ARGV[i]
end
redis.call('XADD', KEYS[2], '*', unpack(fields))
if ARGV[3] ~= '' then
  local marker = redis.call('HGET', KEYS[3], ARGV[3])
  if marker then
    local head = string.match(marker, '^(.*):[^:]*$')
    redis.call('HSET', KEYS[3], ARGV[3], head .. ':failed')
  end
end
if KEYS[4] and ARGV[4] ~= '' then
  if ARGV[5] == 'back' and redis.call('EXISTS', KEYS[4]) == 1 then
    redis.call('INCR', KEYS[4])
  end
  if ARGV[6] == 'forget' then
    redis.call('SREM', KEYS[5], ARGV[4])
  end
  if redis.call('HGET', KEYS[6], ARGV[4]) == ARGV[3] then
    redis.call('HDEL', KEYS[6], ARGV[4])
  end
end
if KEYS[7] and redis.call('DECR', KEYS[7]) < 0 then
  redis.call('SET', KEYS[7], 0) -- entries from before the counter existed
end
return 1
