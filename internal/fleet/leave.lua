-- An instance that stops takes its announcement back at once, rather
-- than leave it to go stale.
--
-- KEYS[1] the instances hash, KEYS[2] the seen set; ARGV[1] the instance
redis.call('ZREM', KEYS[2], ARGV[1])
return redis.call('HDEL', KEYS[1], ARGV[1])
