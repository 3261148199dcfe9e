-- Join a voucher's waiting room, or answer the place already held.
-- Run after place.lua (store.go puts the two together), whose place() it
-- answers with.
--
-- KEYS[1] who       (hash: user -> "p:<hmac hex>", drawn at begin_time, or
--                    "l:<n>", the n-th to join from begin_time on)
-- KEYS[2] pre       (sorted set, every score 0: "<hmac hex>:<user>" of
--                    those who joined before begin_time; Redis orders equal
--                    scores by the member's bytes, so a member's rank is
--                    its place in the draw)
-- KEYS[3] late      (hash: n -> user, who joined from begin_time on)
-- KEYS[4] state     (hash: serving, late, drawn, credit, last, swept)
-- KEYS[5] admitted  (sorted set: user -> end of their hold, in ms)
-- KEYS[6] stock     KEYS[7] buyers (package stock's keys of the voucher)
-- KEYS[8] joined    (hash: user -> when they joined from begin_time on, in
--                    ms: their wait's start, for the metrics)
-- ARGV[1] user ID   ARGV[2] HMAC-SHA256(seed, user ID), lower-case hex
-- ARGV[3] opens_at  ARGV[4] begin_time   ARGV[5] end_time (ms)
--
-- Returns {code} or, for codes 0 and 1, {code, place.lua's place}: the
-- answer of the join in the same round trip. Codes: 0 joined now, 1 in
-- line already (the same place: waiting, or admitted and still holding),
-- 2 not started (before opens_at), 3 ended, 4 sold out (no unit left that
-- is neither sold nor held), 5 already ordered, 6 the stock key is missing
-- (Redis lost it: reload first). Only 0 changes anything.
--
-- Times are the Redis server's, like every deadline of the room: which
-- side of begin_time a join falls on is decided by one clock for every
-- instance.
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local function answer(code, joined)
  local p = place(now, ARGV[1], tonumber(ARGV[4]), joined)
  table.insert(p, 1, code)
  return p
end
if now < tonumber(ARGV[3]) then
  return {2}
end
if now >= tonumber(ARGV[5]) then
  return {3}
end
if redis.call('SISMEMBER', KEYS[7], ARGV[1]) == 1 then
  return {5}
end
local stock = redis.call('GET', KEYS[6])
if not stock then
  return {6}
end
local mine = redis.call('HGET', KEYS[1], ARGV[1])
local untilMs = redis.call('ZSCORE', KEYS[5], ARGV[1])
local ended = untilMs and tonumber(untilMs) <= now
-- In line already: a place, or a hold on (which only a place is given:
-- admit.lua admits who holds one, and nothing takes a place away), and no
-- hold that ended.
if not ended and (mine or untilMs) then
  return answer(1)
end
-- Units neither sold nor held: the room says sold out, and takes no one
-- more, while there are none.
local held = redis.call('ZCOUNT', KEYS[5], '(' .. now, '+inf')
local free = tonumber(stock) - held
if free <= 0 then
  return {4}
end
if ended then
  -- A hold that ended without an order: a new place, at the back (the
  -- ended hold was not counted in `held`, so `free` stands).
  redis.call('ZREM', KEYS[5], ARGV[1])
end
-- Into the draw while it is open: before begin_time, and before the first
-- admission froze it (admit.lua's `drawn`), whatever a clock stepping back
-- says after that.
if now < tonumber(ARGV[4]) and redis.call('HEXISTS', KEYS[4], 'drawn') == 0 then
  mine = 'p:' .. ARGV[2]
  redis.call('ZADD', KEYS[2], 0, ARGV[2] .. ':' .. ARGV[1])
else
  local n = redis.call('HINCRBY', KEYS[4], 'late', 1)
  mine = 'l:' .. n
  redis.call('HSET', KEYS[3], n, ARGV[1])
  redis.call('HSET', KEYS[8], ARGV[1], now)
end
redis.call('HSET', KEYS[1], ARGV[1], mine)
return answer(0, {mine = mine, free = free})
