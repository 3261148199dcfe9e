-- latch_count_down.lua counts a latch down by one, and opens it at zero.
--
-- KEYS[1]  the latch: its count
-- ARGV[1]  the channel waiters listen on (a channel, not a key)
--
-- Returns the count left; 0 when this call opened the latch or it was open.
--
-- Decrementing and opening in one script keeps the two together: with
-- DECR and then DEL in two commands a waiter could see the count at 0 and
-- the key still there, or two callers could both believe they opened it.
-- Opening wakes every waiter ("all"), not one: all of them may go on.
local latch, channel = KEYS[1], ARGV[1]
if redis.call('EXISTS', latch) == 0 then
  return 0
end
local left = redis.call('DECR', latch)
if left > 0 then
  return left
end
redis.call('DEL', latch)
redis.call('PUBLISH', channel, 'all')
return 0
