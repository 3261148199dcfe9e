-- Async mode: after the answer to accept.lua was lost (a timeout, a reset
-- connection), find out whether it accepted the order, and make sure it
-- never will if it has not yet.
--
-- KEYS[1] the voucher's accepted orders (user -> order ID)
-- KEYS[2] the lost request's void mark
-- ARGV[1] user ID   ARGV[2] how long the mark lives, in ms
--
-- Returns the user's order ID, or false after setting the void mark.
--
-- Why the mark: the lost request may not have run yet. It may sit in a
-- socket buffer or a stalled network path and reach Redis after this
-- lookup said "not accepted" and the buyer was told 503. Redis runs scripts
-- one at a time, so once this script has set the mark, accept.lua finds it
-- and does nothing: "not accepted" stays true.
local id = redis.call('HGET', KEYS[1], ARGV[1])
if id then
  return id
end
redis.call('SET', KEYS[2], '1', 'PX', ARGV[2])
return false
