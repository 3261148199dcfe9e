-- Admit one login attempt from a client address (over all phones), or
-- refuse it while the address waits after its wrong guesses, or while it
-- has as many attempts in flight as it may.
--
-- KEYS[1] the address's wrong guesses: a hash with n (wrong guesses) and
--         until (ms: no attempt before then)
-- KEYS[2] the address's attempts in flight: a sorted set of attempt IDs,
--         scored by when each began (ms)
-- ARGV[1] the address's free wrong guesses, before any wait
-- ARGV[2] 1 while many guesses fail everywhere (an attack): the free
--         guesses are gone
-- ARGV[3] this attempt's ID
-- ARGV[4] how long an attempt counts as in flight at most, in ms (one
--         whose instance died is then forgotten)
--
-- Returns {ADMITTED}, {WAIT, ms} or {AT_ONCE, ms} (see limits.go).
--
-- Only wrong guesses are counted (settle_guess.lua, once the phone's
-- script has compared the code): a right code never makes an address
-- wait, which matters behind a carrier's NAT. What keeps attempts at once
-- from all slipping past a gate that the first wrong ones would close is
-- the cap on attempts in flight: an address may have only as many at
-- once as it has free guesses left and one more (one once past them, or
-- during an attack).
-- Were all of them wrong, the count would reach the free ones and one
-- more, as if they had come one by one. Both keys in one slot: they
-- share the address's hash tag. (now_ms, free_guesses and waiting come
-- from wait.lua.)
local ADMITTED, WAIT, AT_ONCE = 0, 1, 2
local now = now_ms()
local free = free_guesses(tonumber(ARGV[1]), ARGV[2] == '1')
local wait, n = waiting(KEYS[1], now, free)
if wait > 0 then
  return {WAIT, wait}
end
local stale = tonumber(ARGV[4])
redis.call('ZREMRANGEBYSCORE', KEYS[2], '-inf', now - stale)
if redis.call('ZCARD', KEYS[2]) >= math.max(free - n + 1, 1) then
  return {AT_ONCE, 1000}
end
redis.call('ZADD', KEYS[2], now, ARGV[3])
redis.call('PEXPIRE', KEYS[2], stale)
return {ADMITTED}
