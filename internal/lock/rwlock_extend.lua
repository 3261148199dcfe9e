-- rwlock_extend.lua renews a reader's lease or the writer's ttl.
--
-- KEYS[1..3]  writer, readers, depths, as in rwlock_obtain.lua
-- ARGV[1]     the owner
-- ARGV[2]     "read" or "write"
-- ARGV[3]     time to live in milliseconds
-- ARGV[4]     "1" for a reentrant owner: lengthen only, as in extend.lua
--
-- Returns EXTENDED, or NOT_HELD if the owner's lease or ttl has ended.
local NOT_HELD, EXTENDED = 0, 1

local writer, readers, depths = KEYS[1], KEYS[2], KEYS[3]
local owner, mode, ttl, reentrant = ARGV[1], ARGV[2], tonumber(ARGV[3]), ARGV[4] == '1'
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)

if mode == 'write' then
  if redis.call('HEXISTS', writer, owner) == 0 then
    return NOT_HELD
  end
  if not reentrant or redis.call('PTTL', writer) < ttl then
    redis.call('PEXPIRE', writer, ttl)
  end
  return EXTENDED
end

local ends = redis.call('ZSCORE', readers, owner)
if not ends or tonumber(ends) <= now then
  return NOT_HELD
end
if not reentrant or tonumber(ends) < now + ttl then
  redis.call('ZADD', readers, now + ttl, owner)
end
local last = redis.call('ZRANGE', readers, -1, -1, 'WITHSCORES')
redis.call('PEXPIRE', readers, tonumber(last[2]) - now)
redis.call('PEXPIRE', depths, tonumber(last[2]) - now)
return EXTENDED
