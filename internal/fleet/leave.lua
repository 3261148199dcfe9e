-- An instance that stops takes its announcement back at once, rather
-- than leave it to go stale: only its own. Under a fixed name (a
-- StatefulSet's, a compose service's), its replacement may have
-- announced under the same name while it drained; that announcement
-- stays.
--
-- KEYS[1] the instances hash, KEYS[2] the seen set, KEYS[3] the started
-- hash (announce.lua's); ARGV[1] the instance,
-- ARGV[2] its own announcement, as it wrote it
if redis.call('HGET', KEYS[1], ARGV[1]) ~= ARGV[2] then
  return 0
end
redis.call('ZREM', KEYS[2], ARGV[1])
redis.call('HDEL', KEYS[3], ARGV[1])
return redis.call('HDEL', KEYS[1], ARGV[1])
