-- fair_release.lua frees a fair lock if the caller holds it and wakes the
-- first in line; or, for a waiter that gives up, leaves the line.
--
-- KEYS[1..3]  lock, queue, alive, as in fair_obtain.lua
-- ARGV[1]     the holder's token, or the owner of a reentrant lock
-- ARGV[2]     channel prefix: the waiter h listens on prefix .. h
-- ARGV[3]     "leave" for a waiter giving up its place, else ""
--
-- Returns RELEASED, ENTERED (a reentrant owner still holds outer levels),
-- or NOT_HELD if the lock expired or belongs to another.
--
-- Only the first in line may take the lock, so only it is woken: waking
-- every waiter would cost a round trip each to find out who is first.
local NOT_HELD, RELEASED, ENTERED = 0, 1, 2

local lock, queue, alive = KEYS[1], KEYS[2], KEYS[3]
local holder, prefix, leave = ARGV[1], ARGV[2], ARGV[3] == 'leave'
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)

if leave then
  redis.call('LREM', queue, 1, holder)
  redis.call('ZREM', alive, holder)
  -- A caller that gave up may yet hold the lock: its last try took it,
  -- and the answer never reached it. Nobody would release it before its
  -- ttl, and the whole line would wait: free it now.
  if redis.call('TYPE', lock).ok == 'string' and redis.call('GET', lock) == holder then
    redis.call('DEL', lock)
  elseif redis.call('EXISTS', lock) == 1 then
    return RELEASED -- the holder will wake the next one
  end
else
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
end

local head = first(queue, alive, now)
if head then
  redis.call('PUBLISH', prefix .. head, 'released')
end
return RELEASED
