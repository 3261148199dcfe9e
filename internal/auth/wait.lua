-- The login limits' wait, in one place: how a count of wrong guesses
-- becomes a wait, and when a wait holds. Not a script alone: the scripts
-- that count wrong guesses or gate on them (admit_guess.lua,
-- check_code.lua, settle_guess.lua) begin with it (limits.go puts it in
-- front of each), so that each is still one atomic script on the keys it
-- is given, in one Cluster slot, and the three cannot disagree.

-- now_ms(): the Redis server's clock, in ms. Every wait is read on it,
-- never on an instance's.
local function now_ms()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end

-- free_guesses(free, attack): the wrong guesses that set no wait, free
-- unless attack (many guesses fail everywhere), when there are none.
local function free_guesses(free, attack)
  if attack then
    return 0
  end
  return free
end

-- wait_after(n, free, first, longest): the wait, in ms, that the n-th
-- wrong guess of a count sets: none for the free ones, then first,
-- doubling with each further one, up to longest. (The exponent stops at
-- 40, where any wait is past longest, so that a count that ran on for
-- ever still gives a number.)
local function wait_after(n, free, first, longest)
  if n <= free then
    return 0
  end
  return math.min(first * 2 ^ math.min(n - free - 1, 40), longest)
end

-- waiting(key, now, free): the ms the count in the hash at key (n: wrong
-- guesses, until: ms, no attempt before then) still waits, 0 if none;
-- and its n. A wait holds only while the count is past the free guesses
-- of the limits in force: raising them lifts the waits they no longer
-- justify.
local function waiting(key, now, free)
  local untilMs = tonumber(redis.call('HGET', key, 'until') or '0')
  local n = tonumber(redis.call('HGET', key, 'n') or '0')
  if untilMs > now and n > free then
    return untilMs - now, n
  end
  return 0, n
end

