-- Close the holds (and claims) of orders committed together, a group
-- commit's batch: confirm.lua for many users in one call (Store.ConfirmAll).
--
-- KEYS, in threes: entries (a bucket's holds or claims), that bucket's
--   buyers, its waiting room's admitted buyers (empty without a room);
--   every key of one call in one slot (the caller groups by shard).
-- ARGV, for each three KEYS in turn: '1' remember the users as buyers
--   there (their home bucket) or '0' not (units taken from another
--   bucket), as confirm.lua's ARGV[2]; the count n; then n user IDs.
--
-- Returns how many entries were still open (the others the sweeper
-- closed, or Redis lost). Each step is confirm.lua's, done for all the
-- users of one three of KEYS at once: ZREM and SADD take many members. Like confirm.lua it
-- removes entries, adds buyers and ends admissions, so running it twice
-- changes nothing.
local closed = 0
local a = 1
for k = 1, #KEYS, 3 do
  local remember = ARGV[a] == '1'
  local last = a + 1 + tonumber(ARGV[a + 1])
  a = a + 2
  -- In slices: unpack puts its values on Lua's stack, which takes 8000
  -- at most. (A batch holds at most 100 orders today: the slices are
  -- for a larger GroupCommit; TestConfirmAllManyHolds.)
  for i = a, last, 1000 do
    local j = math.min(i + 999, last)
    closed = closed + redis.call('ZREM', KEYS[k], unpack(ARGV, i, j))
    if remember then
      redis.call('SADD', KEYS[k + 1], unpack(ARGV, i, j))
    end
  end
  -- A room's hold on the unit ends here, its entry kept with score 0:
  -- see confirm.lua.
  if remember and redis.call('EXISTS', KEYS[k + 2]) == 1 then
    for i = a, last do
      redis.call('ZADD', KEYS[k + 2], 'XX', 0, ARGV[i])
    end
  end
  a = last + 1
end
return closed
