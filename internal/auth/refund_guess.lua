-- Take back an attempt that admit_guess.lua counted as a wrong guess and
-- that was not one: the code was right, or the phone refused the attempt
-- before comparing it.
--
-- KEYS[1] the address's wrong guesses (see admit_guess.lua)
-- ARGV[1] the wait (an until time, in ms) before the attempt
-- ARGV[2] the wait the attempt set
--
-- The count goes back down, and so does the wait, unless another attempt
-- has set a wait of its own since: a right code, or an attempt the phone
-- refused, must not make the address wait longer (behind a carrier's NAT
-- every login would push the next one back). HGET, not HINCRBY, decides:
-- a count that expired meanwhile must not come back without a TTL.
if tonumber(redis.call('HGET', KEYS[1], 'n') or '0') > 0 then
  redis.call('HINCRBY', KEYS[1], 'n', -1)
  if redis.call('HGET', KEYS[1], 'until') == ARGV[2] then
    redis.call('HSET', KEYS[1], 'until', ARGV[1])
  end
end
return 0
