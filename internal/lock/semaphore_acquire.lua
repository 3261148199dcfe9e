-- semaphore_acquire.lua takes n permits of a semaphore of size permits,
-- if that many are free, for one holder and one lease.
--
-- KEYS[1]  leases: sorted set of holder token -> end of its lease, in
--          milliseconds of the Redis clock
-- KEYS[2]  counts: hash of holder token -> permits it holds
-- ARGV[1]  the holder's random token
-- ARGV[2]  n, the permits wanted (1 <= n <= size, checked by the caller)
-- ARGV[3]  size, the permits that exist
-- ARGV[4]  the lease in milliseconds
--
-- Returns {ACQUIRED, 0}, or {TAKEN, ms} where ms is how long until the
-- earliest lease ends (-1 if nobody holds a permit).
--
-- Every holder has a lease. One that dies stops renewing, its lease ends,
-- and the next call here hands its permits back before counting: that is
-- what keeps a crashed holder from leaking permits forever, as a plain
-- counter (INCR/DECR, or Redisson's RSemaphore) does. Time comes from the
-- server's clock (TIME), the one clock every client shares; Redis 7
-- replicates a script's writes, not the script, so reading it is safe.
local TAKEN, ACQUIRED = 0, 1

local leases, counts = KEYS[1], KEYS[2]
local token, n, size, lease = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4])
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)

-- A lease covers [start, end): one that ends now is over.
for _, dead in ipairs(redis.call('ZRANGEBYSCORE', leases, '-inf', now)) do
  redis.call('HDEL', counts, dead)
end
redis.call('ZREMRANGEBYSCORE', leases, '-inf', now)

-- The guard: never more permits out than exist.
local out = 0
for _, c in ipairs(redis.call('HVALS', counts)) do
  out = out + tonumber(c)
end
if out + n > size then
  local first = redis.call('ZRANGE', leases, 0, 0, 'WITHSCORES')
  if first[2] then
    return {TAKEN, tonumber(first[2]) - now}
  end
  return {TAKEN, -1}
end

redis.call('ZADD', leases, now + lease, token)
redis.call('HSET', counts, token, n)
-- Both keys live as long as the longest lease, so a semaphore nobody uses
-- any more leaves nothing behind.
local last = redis.call('ZRANGE', leases, -1, -1, 'WITHSCORES')
redis.call('PEXPIRE', leases, tonumber(last[2]) - now)
redis.call('PEXPIRE', counts, tonumber(last[2]) - now)
return {ACQUIRED, 0}
