-- Store a new login code for a phone, if the phone's limits allow one now.
--
-- KEYS[1] the phone's live codes: a sorted set, each code scored by the
--         time it expires (ms, Redis' clock)
-- KEYS[2] the wait marker: exists while the phone must wait for another code
-- KEYS[3] the count of codes sent to the phone in the current day
-- KEYS[4] the trust marker of this phone and client address: exists when
--         the address logged in to the phone lately
-- ARGV[1] the new code
-- ARGV[2] how long the code is valid, in ms
-- ARGV[3] the least time between two codes, in ms; 0: no such limit
-- ARGV[4] codes per day; 0: no such limit
-- ARGV[5] a day, in ms
-- ARGV[6] live codes kept at most
--
-- Returns {SENT, 0}, or {refusal, ms until asking again may succeed}
-- (TOO_SOON, TOO_MANY; see limits.go).
--
-- Check and record are one script: two requests at once must not both
-- see "no code for a minute" and both send one. Every window is a TTL or
-- a time read from Redis (TIME), so Redis' clock decides when it ends,
-- never the clocks of the instances. The keys share the phone's hash tag:
-- in Redis Cluster they live in one slot, as a script's keys must.
local SENT, TOO_SOON, TOO_MANY = 0, 1, 2

-- The interval holds for everyone, the phone's owner too: a code refused
-- as too soon means a code reached the owner's phone moments ago, and
-- that code logs in.
local interval = tonumber(ARGV[3])
if interval > 0 then
  local wait = redis.call('PTTL', KEYS[2])
  if wait > 0 then
    return {TOO_SOON, wait}
  end
end

-- The day's cap keeps strangers from running up the SMS bill. An address
-- the phone logged in from lately is its owner's: it is neither refused
-- nor counted, so strangers who used up the day cannot keep the owner
-- from a code.
local trusted = redis.call('EXISTS', KEYS[4]) == 1
local perDay = tonumber(ARGV[4])
if perDay > 0 and not trusted then
  local sent = tonumber(redis.call('GET', KEYS[3]) or '0')
  if sent >= perDay then
    return {TOO_MANY, math.max(redis.call('PTTL', KEYS[3]), 1)}
  end
end

if interval > 0 then
  redis.call('SET', KEYS[2], '1', 'PX', ARGV[3])
end
if perDay > 0 and not trusted then
  redis.call('INCR', KEYS[3])
  -- The day starts at the first code. Checked with PTTL rather than
  -- "INCR returned 1", so that a counter left without a TTL (by hand)
  -- cannot refuse the phone for ever.
  if redis.call('PTTL', KEYS[3]) < 0 then
    redis.call('PEXPIRE', KEYS[3], ARGV[5])
  end
end

-- A new code joins the live ones instead of replacing them: every code
-- goes to the owner's phone, so a stranger asking for one must not undo
-- the code the owner is typing in. Each keeps its own expiry; past the
-- cap the oldest go (with the default interval of a minute and codes of
-- five minutes, none goes before it expires).
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
-- Codes sent within one millisecond would tie, and ties sort by the code
-- itself: a millisecond more keeps the newest last, so the oldest goes.
local expires = now + tonumber(ARGV[2])
local newest = redis.call('ZRANGE', KEYS[1], -1, -1, 'WITHSCORES')
if newest[2] and tonumber(newest[2]) >= expires then
  expires = tonumber(newest[2]) + 1
end
redis.call('ZADD', KEYS[1], string.format('%d', expires), ARGV[1])
redis.call('ZREMRANGEBYRANK', KEYS[1], 0, -tonumber(ARGV[6]) - 1)
redis.call('PEXPIRE', KEYS[1], ARGV[2])
return {SENT, 0}
