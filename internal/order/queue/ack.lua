-- Async mode: acknowledge entries whose orders are written, forget their
-- pending markers, and count them off their vouchers' queues.
--
-- KEYS[1] the orders stream   KEYS[2] the pending-orders hash
-- KEYS[2 + i] the queued counter of entry i's voucher
-- ARGV[1] the group; then per entry i: ARGV[2i] its stream ID, ARGV[2i + 1]
-- its order ID
--
-- Returns how many entries were acknowledged by this call. XACK answers 1
-- only for an entry still pending, so an entry written twice (claimed by a
-- second consumer meanwhile) is counted off once.
--
-- Every key is the shard's: the stream's and its vouchers' share the
-- shard's hash tag, so on Redis Cluster the script runs in one slot.
local acked = 0
for i = 1, #KEYS - 2 do
  if redis.call('XACK', KEYS[1], ARGV[1], ARGV[2 * i]) == 1 then
    acked = acked + 1
    if redis.call('DECR', KEYS[2 + i]) < 0 then
      redis.call('SET', KEYS[2 + i], 0) -- entries from before the counter existed
    end
  end
  redis.call('HDEL', KEYS[2], ARGV[2 * i + 1])
end
return acked
