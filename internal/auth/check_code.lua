-- Check a login code once, for one phone and one client address.
--
-- KEYS[1] the phone's live codes: a sorted set, each code scored by the
--         time it expires (ms)
-- KEYS[2] the pair's wrong guesses (this phone, this address): a hash
--         with n (wrong guesses) and until (ms: no guess before then)
-- KEYS[3] the pair's trust marker: exists when the address logged in to
--         the phone lately
-- KEYS[4] the phone's wrong guesses of the last hour from addresses
--         without trust: a sorted set scored by the time of each
-- ARGV[1] the code offered
-- ARGV[2] the pair's free wrong guesses, before any wait
-- ARGV[3] 1 while many guesses fail everywhere (an attack): the free
--         guesses are gone, for pairs without trust
-- ARGV[4] the first wait, in ms; each further wrong guess doubles it
-- ARGV[5] the longest wait, in ms
-- ARGV[6] how long a pair's count is kept after its wait ends, in ms
-- ARGV[7] wrong guesses per phone per hour from addresses without trust
-- ARGV[8] an hour, in ms
-- ARGV[9] how long a login makes the pair trusted, in ms
--
-- Returns {MATCHED, 0}, {WRONG, ms the pair now waits}, or a refusal
-- that compared nothing: {PAIR_WAIT, ms} or {PHONE_BUSY, ms} (see
-- limits.go).
--
-- Gates, comparison and count are one script: guesses at once are
-- counted one after another, so no two of them pass a gate that the
-- first of them should have closed, and a code logs in once (it is
-- deleted). Times come from Redis (TIME), never from an instance. The
-- pair's wait is wait.lua's (now_ms, free_guesses, waiting, wait_after).
local MATCHED, WRONG, PAIR_WAIT, PHONE_BUSY = 0, 1, 2, 3

local now = now_ms()
local trusted = redis.call('EXISTS', KEYS[3]) == 1
local hour = tonumber(ARGV[8])

-- The pair waits after its last wrong guess. Only this address waits on
-- this phone: a stranger's guesses never slow the owner's.
local free = free_guesses(tonumber(ARGV[2]), ARGV[3] == '1' and not trusted)
local pairWait = waiting(KEYS[2], now, free)
if pairWait > 0 then
  return {PAIR_WAIT, pairWait}
end

-- The phone's budget holds the guessers that many addresses together
-- could be (a botnet gets each address's free guesses). An address that
-- logged in to the phone lately is its owner's: neither refused by the
-- budget nor counted in it, so strangers who spend it lock nobody out.
if not trusted then
  redis.call('ZREMRANGEBYSCORE', KEYS[4], '-inf', now - hour)
  if redis.call('ZCARD', KEYS[4]) >= tonumber(ARGV[7]) then
    local oldest = redis.call('ZRANGE', KEYS[4], 0, 0, 'WITHSCORES')
    return {PHONE_BUSY, math.max(tonumber(oldest[2]) + hour - now, 1)}
  end
end

-- Any live code logs in: a stranger asking for codes adds codes, and
-- cannot undo the one the owner received.
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
if redis.call('ZSCORE', KEYS[1], ARGV[1]) then
  redis.call('ZREM', KEYS[1], ARGV[1])
  -- NIST SP 800-63B: after a login, forget the earlier failures of this
  -- user from this address. The pair is trusted from now on.
  redis.call('DEL', KEYS[2])
  redis.call('SET', KEYS[3], '1', 'PX', ARGV[9])
  return {MATCHED, 0}
end

-- A wrong guess (with no live code too: a failed login is a failed
-- login). Past the free ones, each doubles the pair's wait.
local n = redis.call('HINCRBY', KEYS[2], 'n', 1)
local wait = wait_after(n, free, tonumber(ARGV[4]), tonumber(ARGV[5]))
redis.call('HSET', KEYS[2], 'until', string.format('%d', now + wait))
-- Kept a while after the wait ends, so that a guesser who waits out each
-- delay meets the next, longer one; a pair quiet that long starts over.
redis.call('PEXPIRE', KEYS[2], string.format('%d', wait + tonumber(ARGV[6])))
if not trusted then
  -- The member only has to be unique: the time and the count so far.
  redis.call('ZADD', KEYS[4], now, now .. ':' .. redis.call('ZCARD', KEYS[4]))
  redis.call('PEXPIRE', KEYS[4], hour)
end
return {WRONG, wait}
