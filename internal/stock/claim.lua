-- Remember a user as a buyer in their home bucket without taking a unit
-- there: the unit was taken from another bucket (unit.lua).
--
-- KEYS[1] stock, KEYS[2] buyers, KEYS[3] holds, KEYS[4] claims (the home
--         bucket's)
-- ARGV[1] user ID
-- ARGV[2] how long the claim lasts, in ms
-- ARGV[3] 'deadline': answer the claim's deadline (ms, this server's
--         clock) instead of 0 when claimed (async mode: Store.Claim)
--
-- Returns 0 claimed, 2 already bought, 3 the home bucket's keys are
-- missing, 5 another request of the user holds a unit or a claim. The
-- claim is to the buyers set what a hold is to a unit: if the request
-- dies, the sweeper finds it expired and, if no order row exists, forgets
-- the buyer.
if redis.call('EXISTS', KEYS[1]) == 0 then
  return 3
end
if redis.call('SISMEMBER', KEYS[2], ARGV[1]) == 1 then
  if redis.call('ZSCORE', KEYS[3], ARGV[1]) or redis.call('ZSCORE', KEYS[4], ARGV[1]) then
    return 5
  end
  return 2
end
redis.call('SADD', KEYS[2], ARGV[1])
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local deadline = now + tonumber(ARGV[2])
redis.call('ZADD', KEYS[4], deadline, ARGV[1])
if ARGV[3] == 'deadline' then
  return deadline
end
return 0
