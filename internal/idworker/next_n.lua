-- Draw n sequence numbers at once, for Worker.NextN.
--
-- KEYS[1] the day's sequence   ARGV[1] n
--
-- Returns the last number drawn, or -1 when the sequence does not exist:
-- like next_id, this never starts a sequence (see Seed).
if redis.call('EXISTS', KEYS[1]) == 0 then
  return -1
end
return redis.call('INCRBY', KEYS[1], ARGV[1])
