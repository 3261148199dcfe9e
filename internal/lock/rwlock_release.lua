-- rwlock_release.lua gives up one level of a read or write hold, or
-- withdraws a writer's intent, and wakes every waiter when that may let
-- somebody in.
--
-- KEYS[1..4]  writer, readers, depths, intents, as in rwlock_obtain.lua
-- ARGV[1]     the owner
-- ARGV[2]     "read", "write", or "intent" (a writer gave up waiting)
-- ARGV[3]     the channel waiters listen on (a channel, not a key)
--
-- Returns RELEASED, ENTERED (the owner still holds outer levels), or
-- NOT_HELD if the hold was gone or its lease had ended.
--
-- The wake-up goes to all waiters ("all"): when the writer leaves, every
-- waiting reader may enter, and when the last reader leaves, the one to go
-- next is a writer, which waking one waiter at random could miss.
local NOT_HELD, RELEASED, ENTERED = 0, 1, 2

local writer, readers, depths, intents = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local owner, mode, channel = ARGV[1], ARGV[2], ARGV[3]
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)

if mode == 'intent' then
  local woken = redis.call('ZREM', intents, owner) == 1
  -- A writer that gave up may yet hold the lock: its last try took it,
  -- and the answer never reached it. A writer that waited held no level
  -- before (a holder re-enters at once), so one level is that lost grant:
  -- free it now rather than make everyone wait out its ttl.
  if redis.call('HGET', writer, owner) == '1' then
    redis.call('DEL', writer)
    woken = true
  end
  if woken then
    redis.call('PUBLISH', channel, 'all')
  end
  return RELEASED
end

if mode == 'write' then
  if redis.call('HEXISTS', writer, owner) == 0 then
    return NOT_HELD
  end
  if redis.call('HINCRBY', writer, owner, -1) > 0 then
    return ENTERED
  end
  redis.call('DEL', writer)
  redis.call('PUBLISH', channel, 'all')
  return RELEASED
end

local ends = redis.call('ZSCORE', readers, owner)
if not ends then
  return NOT_HELD
end
local code = RELEASED
if tonumber(ends) <= now then
  code = NOT_HELD -- the lease ended: the hold is gone as a whole
  redis.call('HDEL', depths, owner)
elseif redis.call('HINCRBY', depths, owner, -1) > 0 then
  return ENTERED
end
redis.call('ZREM', readers, owner)
redis.call('HDEL', depths, owner)
if redis.call('ZCARD', readers) == 0 then
  redis.call('PUBLISH', channel, 'all')
end
return code
