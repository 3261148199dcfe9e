-- Adds one instance's answers to one voucher in one second, once.
--
-- KEYS[1]: the second's hash, KEYS[2]: the voucher's totals, KEYS[3]: the
-- batch's marker. ARGV[1], ARGV[2], ARGV[3]: how many seconds each lives;
-- then pairs of field and count. A field "lat:<bucket>" counts latencies,
-- kept in the second's hash only.
--
-- The marker makes a batch sent twice count once: the Recorder sends a
-- batch again when it did not hear back, and a reply lost after the
-- script ran would otherwise add its answers a second time.
--
-- Returns 1 when the answers were added now, 0 when they had been before.
if not redis.call('SET', KEYS[3], '1', 'NX', 'EX', ARGV[3]) then
  return 0
end
for i = 4, #ARGV, 2 do
  redis.call('HINCRBY', KEYS[1], ARGV[i], ARGV[i + 1])
  if string.sub(ARGV[i], 1, 4) ~= 'lat:' then
    redis.call('HINCRBY', KEYS[2], ARGV[i], ARGV[i + 1])
  end
end
redis.call('EXPIRE', KEYS[1], ARGV[1])
redis.call('EXPIRE', KEYS[2], ARGV[2])
return 1
