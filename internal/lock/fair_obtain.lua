-- fair_obtain.lua takes a fair lock for the first in line, or puts the
-- caller in line.
--
-- KEYS[1]  the lock, as in obtain.lua: a token string, or a reentrant
--          owner -> depth hash
-- KEYS[2]  queue: list of waiting holders, in order of arrival
-- KEYS[3]  alive: sorted set of waiting holder -> when it counts as dead
--          (ms, Redis clock); every try pushes it later
-- KEYS[4]  the lock's fence counter; it never expires
-- ARGV[1]  the holder: a random token, or the owner of a reentrant lock
-- ARGV[2]  time to live in milliseconds
-- ARGV[3]  "1" for a reentrant lock
-- ARGV[4]  "1" to return a fencing token
-- ARGV[5]  how long a waiter stays in line without trying again (ms);
--          0: try once, never get in line
-- ARGV[6]  channel prefix: the waiter h listens on prefix .. h
--
-- Returns {ACQUIRED, fence}, {REENTERED, fence}, or {TAKEN, ms}: how long
-- until something may change by itself (the lock or the first in line
-- expires), -1 if unknown.
--
-- The lock goes to the first in line, and to a newcomer only if nobody
-- waits. A waiter that dies stops trying, and once its time in line runs
-- out any call removes it, so one dead waiter cannot hold up the line. A
-- free lock with somebody else first in line means that waiter has not
-- noticed yet (its wake-up was lost, or a dead waiter just left before
-- it), so it is woken again.
local TAKEN, ACQUIRED, REENTERED = 0, 1, 2

local lock, queue, alive, fence = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local holder, ttl = ARGV[1], tonumber(ARGV[2])
local reentrant, fencing = ARGV[3] == '1', ARGV[4] == '1'
local patience, prefix = tonumber(ARGV[5]), ARGV[6]
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)

-- wait puts the holder in line, or keeps its place, unless it tries once.
local function wait()
  if patience == 0 then
    return
  end
  if not redis.call('ZSCORE', alive, holder) then
    redis.call('RPUSH', queue, holder)
  end
  redis.call('ZADD', alive, now + patience, holder)
  local last = redis.call('ZRANGE', alive, -1, -1, 'WITHSCORES')
  redis.call('PEXPIRE', queue, tonumber(last[2]) - now)
  redis.call('PEXPIRE', alive, tonumber(last[2]) - now)
end

local head = first(queue, alive, now)
local kind = redis.call('TYPE', lock).ok
if kind == 'hash' and reentrant and redis.call('HEXISTS', lock, holder) == 1 then
  -- An owner entering again does not queue behind others: they wait for it.
  redis.call('HINCRBY', lock, holder, 1)
  local pttl = redis.call('PTTL', lock)
  if pttl >= 0 and pttl < ttl then
    redis.call('PEXPIRE', lock, ttl)
  end
  if fencing then
    return {REENTERED, tonumber(redis.call('GET', fence) or '0')}
  end
  return {REENTERED, 0}
end
if kind ~= 'none' then
  wait()
  return {TAKEN, redis.call('PTTL', lock)}
end

if head and head ~= holder then
  wait()
  redis.call('PUBLISH', prefix .. head, 'released')
  return {TAKEN, tonumber(redis.call('ZSCORE', alive, head)) - now}
end
if head then
  redis.call('LPOP', queue)
  redis.call('ZREM', alive, holder)
end

local token = 0
if reentrant then
  redis.call('HSET', lock, holder, 1)
  redis.call('PEXPIRE', lock, ttl)
  -- Always: entering again hands back the outermost acquisition's token.
  token = redis.call('INCR', fence)
else
  redis.call('SET', lock, holder, 'PX', ttl)
  if fencing then
    token = redis.call('INCR', fence)
  end
end
if fencing then
  return {ACQUIRED, token}
end
return {ACQUIRED, 0}
