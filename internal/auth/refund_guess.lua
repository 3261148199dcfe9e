-- Take back an attempt that admit_guess.lua counted as a wrong guess and
-- that was not one: the code was right, or the phone refused the attempt
-- before comparing it.
--
-- KEYS[1] the address's wrong guesses (see admit_guess.lua)
--
-- The wait that the attempt set stays: it ends within the delay that the
-- address's earlier wrong guesses had earned anyway. HGET, not HINCRBY,
-- decides: a count that expired meanwhile must not come back without a
-- TTL.
if tonumber(redis.call('HGET', KEYS[1], 'n') or '0') > 0 then
  redis.call('HINCRBY', KEYS[1], 'n', -1)
end
return 0
