-- Read one user's place in a voucher's waiting room, and the room's
-- figures: place.lua's place, at the Redis server's clock.
--
-- KEYS as place.lua's.   ARGV[1] user ID ('' for the room's figures
-- alone)   ARGV[2] begin_time (ms)
local t = redis.call('TIME')
return place(tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000), ARGV[1], tonumber(ARGV[2]))
