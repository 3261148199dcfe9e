-- Take one unit from a bucket that is not the user's home bucket (see
-- buckets.go), for a user whose home bucket is empty.
--
-- KEYS[1] stock, KEYS[2] holds (this bucket's)
-- ARGV[1] user ID
-- ARGV[2] how long the hold lasts, in ms
--
-- Returns take.lua's codes: 0 taken, 1 sold out, 3 stock key missing,
-- 4 sold out with holds still open, 5 the user already holds a unit here.
-- The buyer is not checked here: the user is remembered only in their home
-- bucket, and the caller claims them there (claim.lua) before the unit
-- counts; a second request of the same user loses that claim and gives its
-- unit back.
local stock = redis.call('GET', KEYS[1])
if not stock then
  return 3
end
if tonumber(stock) <= 0 then
  if redis.call('ZCARD', KEYS[2]) > 0 then
    return 4
  end
  return 1
end
-- One hold per user per bucket: a second would overwrite the first's
-- deadline, and one give-back would then close both.
if redis.call('ZSCORE', KEYS[2], ARGV[1]) then
  return 5
end
redis.call('DECR', KEYS[1])
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
redis.call('ZADD', KEYS[2], now + tonumber(ARGV[2]), ARGV[1])
return 0
