-- semaphore_extend.lua renews a holder's lease on its permits.
--
-- KEYS[1]  leases: sorted set of holder token -> end of its lease (ms)
-- KEYS[2]  counts: hash of holder token -> permits it holds
-- ARGV[1]  the holder's token
-- ARGV[2]  the new lease in milliseconds, counted from now
--
-- Returns EXTENDED, or NOT_HELD if the lease has ended: then the permits
-- were free for others to take, even if nobody has purged the entry yet.
-- The lease is set, shorter or longer: each token has one holder.
local NOT_HELD, EXTENDED = 0, 1

local leases, counts = KEYS[1], KEYS[2]
local token, lease = ARGV[1], tonumber(ARGV[2])
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)

local ends = redis.call('ZSCORE', leases, token)
if not ends or tonumber(ends) <= now then
  return NOT_HELD
end
redis.call('ZADD', leases, now + lease, token)
local last = redis.call('ZRANGE', leases, -1, -1, 'WITHSCORES')
redis.call('PEXPIRE', leases, tonumber(last[2]) - now)
redis.call('PEXPIRE', counts, tonumber(last[2]) - now)
return EXTENDED
