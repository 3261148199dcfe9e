-- release.lua frees a lock if the caller still holds it, and tells waiters.
--
-- Comparing and deleting in one script is the point: GET, compare, DEL in
-- three round trips can delete a lock that expired and was taken by another
-- client between the GET and the DEL.
--
-- KEYS[1]  the lock (a token string, or a reentrant owner -> depth hash)
-- ARGV[1]  the holder's token, or the owner of a reentrant lock
-- ARGV[2]  the channel waiters listen on (a channel, not a key)
--
-- Returns RELEASED, ENTERED (a reentrant owner still holds outer levels),
-- or NOT_HELD if the lock expired or belongs to another.
local NOT_HELD, RELEASED, ENTERED = 0, 1, 2

local lock, holder = KEYS[1], ARGV[1]
local kind = redis.call('TYPE', lock).ok
if kind == 'string' then
  if redis.call('GET', lock) ~= holder then
    return NOT_HELD
  end
elseif kind == 'hash' then
  if redis.call('HEXISTS', lock, holder) == 0 then
    return NOT_HELD
  end
  if redis.call('HINCRBY', lock, holder, -1) > 0 then
    return ENTERED
  end
else
  return NOT_HELD
end
redis.call('DEL', lock)
redis.call('PUBLISH', ARGV[2], 'released')
return RELEASED
