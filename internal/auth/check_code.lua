-- Check a login code once, counting wrong guesses per code and per phone.
--
-- KEYS[1] the code's hash: code, tries (wrong guesses on this code)
-- KEYS[2] the count of the phone's wrong guesses in the current day
-- KEYS[3] the lock marker: exists while the phone is locked
-- ARGV[1] the code offered
-- ARGV[2] wrong guesses that burn a code
-- ARGV[3] wrong guesses per day; the one that reaches it locks the phone
-- ARGV[4] how long the lock lasts, in ms
-- ARGV[5] a day, in ms
--
-- Returns {MATCHED, 0}, {WRONG, 0} or {LOCKED, ms until the lock ends}
-- (see limits.go).
--
-- In one script so that two requests with the right code cannot both log
-- in (a code logs in once: it is deleted), and guesses are counted without
-- a race. The count of the day is the phone's, not the code's: a resend
-- replaces the code and its tries, but not the wrong guesses already made,
-- so "ask for a code, guess five times" cannot be repeated for ever.
local MATCHED, WRONG, LOCKED = 0, 1, 2

-- While locked, even the right code fails: else the lock would only slow
-- down a guesser, who could go on guessing and be told when they won.
local locked = redis.call('PTTL', KEYS[3])
if locked > 0 then
  return {LOCKED, locked}
end

local code = redis.call('HGET', KEYS[1], 'code')
if not code then
  -- No code (never sent, expired, used or burnt): nothing to guess, so
  -- nothing is counted.
  return {WRONG, 0}
end
if code == ARGV[1] then
  redis.call('DEL', KEYS[1])
  return {MATCHED, 0}
end

local misses = redis.call('INCR', KEYS[2])
if redis.call('PTTL', KEYS[2]) < 0 then
  redis.call('PEXPIRE', KEYS[2], ARGV[5])
end
if misses >= tonumber(ARGV[3]) then
  -- The day's limit: lock the phone and burn its code. The count stays,
  -- so once the lock ends, each further wrong guess that day locks the
  -- phone again.
  redis.call('SET', KEYS[3], '1', 'PX', ARGV[4])
  redis.call('DEL', KEYS[1])
  return {WRONG, 0}
end
if redis.call('HINCRBY', KEYS[1], 'tries', 1) >= tonumber(ARGV[2]) then
  redis.call('DEL', KEYS[1])
end
return {WRONG, 0}
