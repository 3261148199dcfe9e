-- List users whose holds and claims expired, by the Redis server's clock.
--
-- KEYS[1] holds, KEYS[2] claims
-- ARGV[1] the most to list of each
--
-- Returns two lists: the holds', the claims'.
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
return {
  redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', now, 'LIMIT', 0, tonumber(ARGV[1])),
  redis.call('ZRANGEBYSCORE', KEYS[2], '-inf', now, 'LIMIT', 0, tonumber(ARGV[1])),
}
