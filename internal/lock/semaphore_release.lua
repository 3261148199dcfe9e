-- semaphore_release.lua gives a holder's permits back and tells waiters.
--
-- KEYS[1]  leases: sorted set of holder token -> end of its lease (ms)
-- KEYS[2]  counts: hash of holder token -> permits it holds
-- ARGV[1]  the holder's token
-- ARGV[2]  the channel waiters listen on (a channel, not a key)
--
-- Returns RELEASED, or NOT_HELD if the holder has no permits (released
-- already, or purged after its lease ended) or its lease has ended.
--
-- It wakes every waiter (the message "all"), not one: waiters want
-- different numbers of permits, and one woken waiter that wants more than
-- came back would go back to sleep with the wake-up another could use.
local NOT_HELD, RELEASED = 0, 1

local leases, counts = KEYS[1], KEYS[2]
local token = ARGV[1]
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)

local ends = redis.call('ZSCORE', leases, token)
if not ends then
  return NOT_HELD
end
redis.call('ZREM', leases, token)
redis.call('HDEL', counts, token)
redis.call('PUBLISH', ARGV[2], 'all')
if tonumber(ends) <= now then
  return NOT_HELD -- its lease had ended: the permits were no longer its own
end
return RELEASED
