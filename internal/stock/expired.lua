-- List users whose holds expired, by the Redis server's clock.
--
-- KEYS[1] holds
-- ARGV[1] the most to list
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
return redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', now, 'LIMIT', 0, tonumber(ARGV[1]))
