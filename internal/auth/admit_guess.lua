-- Admit one login attempt from a client address (over all phones), or
-- refuse it while the address waits after its wrong guesses.
--
-- KEYS[1] the address's wrong guesses: a hash with n (wrong guesses) and
--         until (ms: no attempt before then)
-- ARGV[1] the address's free wrong guesses, before any wait
-- ARGV[2] 1 while many guesses fail everywhere (an attack): the free
--         guesses are gone
-- ARGV[3] the first wait, in ms; each further wrong guess doubles it
-- ARGV[4] the longest wait, in ms
-- ARGV[5] how long the count is kept after its wait ends, in ms
--
-- Returns {0, the wait before, the wait set} when the attempt is
-- admitted (the waits as until times, in ms, for refund_guess.lua), else
-- {the ms until one may be}.
--
-- An admitted attempt is counted as a wrong guess before its code is
-- compared (refund_guess.lua takes it back if it was not one): the code
-- is checked by another script, on the phone's keys, which in Redis
-- Cluster live in another slot. Counting first is what keeps attempts at
-- once from all passing the gate that the first of them closes.
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local free = tonumber(ARGV[1])
if ARGV[2] == '1' then
  free = 0
end
local untilMs = tonumber(redis.call('HGET', KEYS[1], 'until') or '0')
local n = tonumber(redis.call('HGET', KEYS[1], 'n') or '0')
-- A wait holds while the count is past the free guesses of the limits in
-- force: raising them lifts the waits they no longer justify.
if untilMs > now and n > free then
  return {untilMs - now}
end
n = redis.call('HINCRBY', KEYS[1], 'n', 1)
local wait = 0
if n > free then
  wait = math.min(tonumber(ARGV[3]) * 2 ^ math.min(n - free - 1, 40), tonumber(ARGV[4]))
end
local set = string.format('%d', now + wait)
redis.call('HSET', KEYS[1], 'until', set)
redis.call('PEXPIRE', KEYS[1], string.format('%d', wait + tonumber(ARGV[5])))
return {0, string.format('%d', untilMs), set}
