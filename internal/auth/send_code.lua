-- Store a new login code for a phone, if the phone's limits allow one now.
--
-- KEYS[1] the code's hash: code, tries (wrong guesses on this code)
-- KEYS[2] the wait marker: exists while the phone must wait for another code
-- KEYS[3] the count of codes sent to the phone in the current day
-- KEYS[4] the lock marker: exists while the phone is locked after too
--         many wrong guesses
-- ARGV[1] the new code
-- ARGV[2] how long the code is valid, in ms
-- ARGV[3] the least time between two codes, in ms; 0: no such limit
-- ARGV[4] codes per day; 0: no such limit
-- ARGV[5] a day, in ms
--
-- Returns {SENT, 0}, or {refusal, ms until asking again may succeed}
-- (TOO_SOON, TOO_MANY, LOCKED; see limits.go).
--
-- Check and record are one script: two requests at once must not both
-- see "no code for a minute" and both send one. Every window is a TTL, so
-- Redis' clock decides when it ends, never the clocks of the instances.
-- The keys share the phone's hash tag: in Redis Cluster they live in one
-- slot, as a script's keys must.
local SENT, TOO_SOON, TOO_MANY, LOCKED = 0, 1, 2, 3

-- A locked phone gets no code: it could not use one before the lock ends,
-- and every code is an SMS someone pays for.
local locked = redis.call('PTTL', KEYS[4])
if locked > 0 then
  return {LOCKED, locked}
end

local interval = tonumber(ARGV[3])
if interval > 0 then
  local wait = redis.call('PTTL', KEYS[2])
  if wait > 0 then
    return {TOO_SOON, wait}
  end
end

local perDay = tonumber(ARGV[4])
if perDay > 0 then
  local sent = tonumber(redis.call('GET', KEYS[3]) or '0')
  if sent >= perDay then
    return {TOO_MANY, math.max(redis.call('PTTL', KEYS[3]), 1)}
  end
end

if interval > 0 then
  redis.call('SET', KEYS[2], '1', 'PX', ARGV[3])
end
if perDay > 0 then
  redis.call('INCR', KEYS[3])
  -- The day starts at the first code. Checked with PTTL rather than
  -- "INCR returned 1", so that a counter left without a TTL (by hand)
  -- cannot refuse the phone for ever.
  if redis.call('PTTL', KEYS[3]) < 0 then
    redis.call('PEXPIRE', KEYS[3], ARGV[5])
  end
end
-- A new code replaces the old one, with a fresh count of tries; the
-- phone's wrong guesses of the day (another key) carry on.
redis.call('DEL', KEYS[1])
redis.call('HSET', KEYS[1], 'code', ARGV[1], 'tries', 0)
redis.call('PEXPIRE', KEYS[1], ARGV[2])
return {SENT, 0}
