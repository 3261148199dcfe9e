-- extend.lua resets the time to live of a lock if the caller still holds it.
--
-- KEYS[1]  the lock (a token string, or a reentrant owner -> depth hash)
-- ARGV[1]  the holder's token, or the owner of a reentrant lock
-- ARGV[2]  time to live in milliseconds
--
-- Returns EXTENDED, or NOT_HELD if the lock expired or belongs to another.
local NOT_HELD, EXTENDED = 0, 1

local lock, holder = KEYS[1], ARGV[1]
local kind = redis.call('TYPE', lock).ok
if (kind == 'string' and redis.call('GET', lock) == holder)
    or (kind == 'hash' and redis.call('HEXISTS', lock, holder) == 1) then
  redis.call('PEXPIRE', lock, ARGV[2])
  return EXTENDED
end
return NOT_HELD
