-- Count one login code request from a client address.
--
-- KEYS[1] the address's count of requests in the current window
-- ARGV[1] requests allowed per window
-- ARGV[2] the window, in ms
--
-- Returns 0 when the request is allowed, else the ms until the window
-- ends. Count and check are one step, so that requests at once cannot all
-- read "19" and all pass. The window starts at the address's first
-- request and is a TTL: Redis' clock ends it, not the instances'.
local n = redis.call('INCR', KEYS[1])
local left = redis.call('PTTL', KEYS[1])
if left < 0 then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  left = tonumber(ARGV[2])
end
if n > tonumber(ARGV[1]) then
  return left
end
return 0
