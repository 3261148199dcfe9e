-- extend.lua renews a lock if the caller still holds it.
--
-- KEYS[1]  the lock (a token string, or a reentrant owner -> depth hash)
-- ARGV[1]  the holder's token, or the owner of a reentrant lock
-- ARGV[2]  time to live in milliseconds
--
-- Returns EXTENDED, or NOT_HELD if the lock expired or belongs to another.
-- EXTENDED promises the lock lives at least ttl more milliseconds.
--
-- A token lock has exactly one holder, and nobody else was promised
-- anything: its expiry is set to ttl, shorter or longer, as the holder asks.
--
-- A reentrant lock is shared by every handle of its owner, and each of them
-- trusts the ttl it was given (by obtain.lua or by its last renewal). If
-- one handle could cut the expiry, say an inner handle's watchdog renewing
-- with its short ttl, or an explicit Extend with a short ttl, the key could
-- expire under an outer handle that still believes it holds the lock, and
-- another owner would take it. So, as in obtain.lua, the expiry only moves
-- later: it becomes the later of now + ttl and what it was. Either way the
-- lock lives at least ttl more, which is all the caller counts on. The
-- remaining time comes from the server (PTTL), not from a client's clock.
local NOT_HELD, EXTENDED = 0, 1

local lock, holder, ttl = KEYS[1], ARGV[1], ARGV[2]
local kind = redis.call('TYPE', lock).ok
if kind == 'string' and redis.call('GET', lock) == holder then
  redis.call('PEXPIRE', lock, ttl)
  return EXTENDED
end
if kind == 'hash' and redis.call('HEXISTS', lock, holder) == 1 then
  -- PTTL is -1 only if somebody removed the expiry by hand (PERSIST):
  -- then the lock already lives longer than any ttl, so leave it be.
  local pttl = redis.call('PTTL', lock)
  if pttl >= 0 and pttl < tonumber(ttl) then
    redis.call('PEXPIRE', lock, ttl)
  end
  return EXTENDED
end
return NOT_HELD
