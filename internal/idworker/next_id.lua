-- next_id draws an order ID inside a script, for scripts that allocate it
-- in the same atomic step as the order (package idworker's layout):
--
--   id = seconds << 32 | INCR(key)
--
-- seq_key is the day's sequence key; hi and lo are the time part
-- (seconds << 32) split as floor(x / 1e9) and x % 1e9, because Lua numbers
-- are doubles and cannot hold a 63-bit integer: the ID is added up in two
-- halves and returned as a decimal string.
--
-- Returns the ID, or nil and why: 'missing' when the day's sequence does
-- not exist (the day's first ID, or Redis lost the key: INCR would start
-- again at 1 and repeat IDs already given out, so the caller seeds it above
-- every ID in use with idworker's Seed and tries again), 'exhausted' when
-- its 32 bits are used up.
local function next_id(seq_key, hi, lo)
  if redis.call('EXISTS', seq_key) == 0 then
    return nil, 'missing'
  end
  local seq = redis.call('INCR', seq_key)
  if seq > 4294967295 then
    return nil, 'exhausted'
  end
  local low = tonumber(lo) + seq
  local high = tonumber(hi) + math.floor(low / 1000000000)
  low = low % 1000000000
  if high > 0 then
    return string.format('%d%09d', high, low)
  end
  return string.format('%d', low)
end
