-- Give back the unit a user's hold took, or close a user's claim.
--
-- KEYS[1] stock, KEYS[2] buyers, KEYS[3] holds (or claims: see ARGV[4])
-- ARGV[1] user ID
-- ARGV[2] '1': forget the user as a buyer too; '0': the user really holds
--         an order (the unique index said so), so keep them remembered
-- ARGV[3] '1': only if the hold has expired (the sweeper reclaiming what
--         a dead process took); '0': at once (the request itself failed)
-- ARGV[4] '1': KEYS[3] holds units, and the unit goes back; '0': KEYS[3]
--         is the claims of a bucketed voucher's home bucket, whose units
--         are elsewhere (buckets.go)
-- ARGV[5] (optional) the entry's deadline: act only on this one, not on a
--         newer request's entry of the same user (async mode's Unclaim)
--
-- Returns 1 if the unit went back, 0 if there was no such hold (already
-- given back or confirmed, or lost with a Redis flush). Removing the hold
-- and adding the unit in one script is what makes giving back exactly-once:
-- a request and the sweeper cannot both return the same unit.
local deadline = redis.call('ZSCORE', KEYS[3], ARGV[1])
if not deadline or (ARGV[5] and tonumber(deadline) ~= tonumber(ARGV[5])) then
  return 0
end
if ARGV[3] == '1' then
  local t = redis.call('TIME')
  local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
  if tonumber(deadline) > now then
    return 0
  end
end
redis.call('ZREM', KEYS[3], ARGV[1])
if ARGV[4] == '1' and redis.call('EXISTS', KEYS[1]) == 1 then
  redis.call('INCR', KEYS[1])
end
if ARGV[2] == '1' then
  redis.call('SREM', KEYS[2], ARGV[1])
end
return 1
