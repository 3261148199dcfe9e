-- obtain.lua acquires a lock, or enters it again for the same owner.
--
-- KEYS[1]  the lock: a string holding the holder's token, or, for a
--          reentrant lock, a hash of owner -> depth (as in Redisson)
-- KEYS[2]  the lock's fence counter; it never expires
-- ARGV[1]  the holder: a random token, or the owner of a reentrant lock
-- ARGV[2]  time to live in milliseconds
-- ARGV[3]  "1" for a reentrant lock
-- ARGV[4]  "1" to return a fencing token
--
-- Returns {code, n}:
--   {ACQUIRED, fence}   the lock is ours; fence is 0 unless asked for
--   {REENTERED, fence}  the owner already held it; depth is now one more,
--                       fence is the token of the outermost acquisition
--   {TAKEN, pttl}       somebody else holds it for pttl more milliseconds
--
-- Entering again may lengthen the lock, never shorten it. The owner's
-- outer handles were each promised their own ttl and trust it locally:
-- had an inner acquisition with a shorter ttl cut the expiry, the key would
-- vanish under them and another owner could take it while they still
-- believed they held it. So the new expiry is the later of the two. The
-- remaining time comes from the server (PTTL), not from a client's clock.
local TAKEN, ACQUIRED, REENTERED = 0, 1, 2

local lock, fence = KEYS[1], KEYS[2]
local holder, ttl = ARGV[1], ARGV[2]
local reentrant, fencing = ARGV[3] == '1', ARGV[4] == '1'

if reentrant then
  local kind = redis.call('TYPE', lock).ok
  if kind == 'hash' and redis.call('HEXISTS', lock, holder) == 1 then
    redis.call('HINCRBY', lock, holder, 1)
    -- PTTL is -1 only if somebody removed the expiry by hand (PERSIST):
    -- then the lock already lives longer than any ttl, so leave it be.
    local pttl = redis.call('PTTL', lock)
    if pttl >= 0 and pttl < tonumber(ttl) then
      redis.call('PEXPIRE', lock, ttl)
    end
    if fencing then
      return {REENTERED, tonumber(redis.call('GET', fence) or '0')}
    end
    return {REENTERED, 0}
  end
  if kind ~= 'none' then
    return {TAKEN, redis.call('PTTL', lock)}
  end
  redis.call('HSET', lock, holder, 1)
  redis.call('PEXPIRE', lock, ttl)
  -- A fresh reentrant acquisition always takes a token, so that entering
  -- again can hand back the token the owner holds.
  local token = redis.call('INCR', fence)
  if fencing then
    return {ACQUIRED, token}
  end
  return {ACQUIRED, 0}
end

if not redis.call('SET', lock, holder, 'NX', 'PX', ttl) then
  return {TAKEN, redis.call('PTTL', lock)}
end
if fencing then
  return {ACQUIRED, redis.call('INCR', fence)}
end
return {ACQUIRED, 0}
