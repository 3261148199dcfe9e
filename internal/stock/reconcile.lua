-- Correct a stock count that drifted from the database, but only if
-- nothing moved while the caller read the database.
--
-- KEYS[1] stock, KEYS[2] holds
-- ARGV[1] the stock the caller saw before reading the database
-- ARGV[2] the stock the database says is left
--
-- Returns 1 if corrected. With no hold open and the count unchanged, no
-- request was between taking a unit and writing its order while the caller
-- read the database, so the database figure is the whole truth.
if redis.call('ZCARD', KEYS[2]) > 0 then
  return 0
end
local stock = redis.call('GET', KEYS[1])
if not stock or stock ~= ARGV[1] or stock == ARGV[2] then
  return 0
end
redis.call('SET', KEYS[1], ARGV[2])
return 1
