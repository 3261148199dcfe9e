-- Count one event in a fixed window: a code request from a client
-- address (a minute), or a wrong guess anywhere (the global minute).
--
-- KEYS[1] the count of events in the current window
-- ARGV[1] events allowed per window
-- ARGV[2] the window, in ms
--
-- Returns 0 while the count is within the limit, else the ms until the
-- window ends. Count and check are one step, so that requests at once
-- cannot all read "19" and all pass. The window starts at the first
-- event and is a TTL: Redis' clock ends it, not the instances'.
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
