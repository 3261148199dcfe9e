-- Settle an attempt that admit_guess.lua let in: it is no longer in
-- flight, and if it was a wrong guess, the address's count grows and,
-- past its free guesses, so does its wait.
--
-- KEYS[1] the address's wrong guesses (hash: n, until)
-- KEYS[2] the address's attempts in flight (see admit_guess.lua)
-- ARGV[1] the attempt's ID
-- ARGV[2] 1 if it was a wrong guess
-- ARGV[3] the address's free wrong guesses
-- ARGV[4] 1 during an attack: no free guesses
-- ARGV[5] the first wait, in ms; each further wrong guess doubles it
-- ARGV[6] the longest wait, in ms
-- ARGV[7] how long the count is kept after its wait ends, in ms
--
-- The wait is wait.lua's (now_ms, free_guesses, wait_after).
redis.call('ZREM', KEYS[2], ARGV[1])
if ARGV[2] ~= '1' then
  return 0
end
local now = now_ms()
local free = free_guesses(tonumber(ARGV[3]), ARGV[4] == '1')
local n = redis.call('HINCRBY', KEYS[1], 'n', 1)
local wait = wait_after(n, free, tonumber(ARGV[5]), tonumber(ARGV[6]))
-- Attempts settle in any order: a wait only grows.
local untilMs = math.max(now + wait, tonumber(redis.call('HGET', KEYS[1], 'until') or '0'))
redis.call('HSET', KEYS[1], 'until', string.format('%d', untilMs))
redis.call('PEXPIRE', KEYS[1], string.format('%d', untilMs - now + tonumber(ARGV[7])))
return 0
