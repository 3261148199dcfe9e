-- rwlock_obtain.lua takes a read-write lock for reading or for writing, or
-- enters it again for the same owner.
--
-- KEYS[1]  writer: hash of the writing owner -> depth, expiring with its ttl
-- KEYS[2]  readers: sorted set of reading owner -> end of its lease (ms,
--          Redis clock); each reader has its own lease, so one that dies
--          leaves on its own while the others go on renewing
-- KEYS[3]  depths: hash of reading owner -> depth
-- KEYS[4]  intents: sorted set of waiting writer -> end of its intent (ms)
-- ARGV[1]  the owner: WithOwner's, or a random token
-- ARGV[2]  "read" or "write"
-- ARGV[3]  time to live in milliseconds
-- ARGV[4]  "1" for a reentrant owner: its other handles count on their
--          ttl, so its expiry is only ever lengthened
-- ARGV[5]  how long a refused writer's intent lasts (ms); 0: try once,
--          leave no intent
--
-- Returns {ACQUIRED, 0}, {REENTERED, 0}, or {TAKEN, ms}: how long until
-- something may change (a lease or an intent ends), -1 if unknown.
--
-- Many readers or one writer. A refused writer leaves an intent, and while
-- one is live no new reader gets in, so the readers drain and the writer
-- goes next: else a stream of overlapping readers would keep it out
-- forever. Owners who read or write already may enter again despite an
-- intent, or they would wait for a writer who waits for them. A reader
-- cannot become the writer (two readers doing so would wait for each other
-- forever); the writer may read, though.
local TAKEN, ACQUIRED, REENTERED = 0, 1, 2

local writer, readers, depths, intents = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local owner, mode, ttl = ARGV[1], ARGV[2], tonumber(ARGV[3])
local reentrant, intent = ARGV[4] == '1', tonumber(ARGV[5])
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)

-- Readers and writers whose lease or intent ended are gone.
for _, dead in ipairs(redis.call('ZRANGEBYSCORE', readers, '-inf', now)) do
  redis.call('HDEL', depths, dead)
end
redis.call('ZREMRANGEBYSCORE', readers, '-inf', now)
redis.call('ZREMRANGEBYSCORE', intents, '-inf', now)

-- expire makes key live until at least the end of its last entry.
local function expire(key)
  local last = redis.call('ZRANGE', key, -1, -1, 'WITHSCORES')
  if last[2] then
    local left = tonumber(last[2]) - now
    if redis.call('PTTL', key) < left then
      redis.call('PEXPIRE', key, left)
    end
  end
end

-- untilFirst returns the ms until the first entry of a sorted set ends.
local function untilFirst(key)
  local first = redis.call('ZRANGE', key, 0, 0, 'WITHSCORES')
  if first[2] then
    return tonumber(first[2]) - now
  end
  return -1
end

local w = redis.call('HKEYS', writer)[1]

if mode == 'read' then
  if w and w ~= owner then
    return {TAKEN, redis.call('PTTL', writer)}
  end
  local mine = redis.call('ZSCORE', readers, owner)
  if not mine and not w and redis.call('ZCARD', intents) > 0 then
    return {TAKEN, untilFirst(intents)}
  end
  local ends = now + ttl
  if mine and reentrant and tonumber(mine) > ends then
    ends = tonumber(mine)
  end
  redis.call('ZADD', readers, ends, owner)
  redis.call('HINCRBY', depths, owner, 1)
  expire(readers)
  redis.call('PEXPIRE', depths, redis.call('PTTL', readers))
  if mine then
    return {REENTERED, 0}
  end
  return {ACQUIRED, 0}
end

if w == owner then
  redis.call('HINCRBY', writer, owner, 1)
  if redis.call('PTTL', writer) < ttl then
    redis.call('PEXPIRE', writer, ttl)
  end
  return {REENTERED, 0}
end
if w or redis.call('ZCARD', readers) > 0 then
  if intent > 0 then
    redis.call('ZADD', intents, now + intent, owner)
    expire(intents)
  end
  if w then
    return {TAKEN, redis.call('PTTL', writer)}
  end
  return {TAKEN, untilFirst(readers)}
end
redis.call('HSET', writer, owner, 1)
redis.call('PEXPIRE', writer, ttl)
redis.call('ZREM', intents, owner)
return {ACQUIRED, 0}
