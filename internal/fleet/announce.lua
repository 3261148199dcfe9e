-- Announce an instance, forget the stale ones, and list who is alive, in
-- one step on one slot (both keys carry the {fleet} hash tag).
--
-- KEYS[1] the instances hash: instance -> its announcement (JSON)
-- KEYS[2] the seen set: instance -> when it last announced (ms, Redis' clock)
-- KEYS[3] the started hash: instance -> when the process that announced
--         under that name started (ms)
-- ARGV[1] the instance to announce, or "" to only read
-- ARGV[2] its announcement
-- ARGV[3] how long an announcement stays fresh, in ms
-- ARGV[4] when the announcing process started (ms)
--
-- Two processes under one name (a replacement that announces while the
-- instance it replaces drains): the one started last keeps the name, and
-- the older one's announcements change nothing, so that its last one
-- cannot come after the replacement's and be taken back with it.
--
-- Every time is Redis' own (TIME), never an instance's: instances on
-- machines whose clocks disagree still agree on who is fresh.
--
-- Returns the time now, then for each live instance its name, when it
-- was last seen and its announcement.
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local started = ARGV[1] ~= '' and redis.call('HGET', KEYS[3], ARGV[1])
if ARGV[1] ~= '' and (not started or tonumber(started) <= tonumber(ARGV[4])) then
  redis.call('HSET', KEYS[1], ARGV[1], ARGV[2])
  redis.call('ZADD', KEYS[2], now, ARGV[1])
  redis.call('HSET', KEYS[3], ARGV[1], ARGV[4])
  -- Once nobody has announced for that long, every announcement in
  -- them is stale: the keys go too (after a rollback to a version that
  -- announces nothing, say).
  for i = 1, 3 do
    redis.call('PEXPIRE', KEYS[i], ARGV[3])
  end
end
local stale = redis.call('ZRANGEBYSCORE', KEYS[2], '-inf', '(' .. (now - tonumber(ARGV[3])))
for _, id in ipairs(stale) do
  redis.call('ZREM', KEYS[2], id)
  redis.call('HDEL', KEYS[1], id)
  redis.call('HDEL', KEYS[3], id)
end
local out = {now}
local seen = redis.call('ZRANGE', KEYS[2], 0, -1, 'WITHSCORES')
for i = 1, #seen, 2 do
  out[#out + 1] = seen[i]
  out[#out + 1] = seen[i + 1]
  out[#out + 1] = redis.call('HGET', KEYS[1], seen[i]) or ''
end
return out
