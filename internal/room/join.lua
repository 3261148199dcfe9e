-- Join a voucher's waiting room, or answer the place already held, for
-- one joiner or several at once. Run after place.lua (store.go puts the
-- two together), whose place() it answers with.
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
-- ARGV[1] opens_at  ARGV[2] begin_time   ARGV[3] end_time (ms)
-- ARGV[4], ARGV[5]: a joiner's user ID and HMAC-SHA256(seed, user ID) in
-- lower-case hex; then the next joiner's two, and so on. Several joiners
-- in one call (store.go gathers the joins that arrive while one call is
-- on its way) cost Redis one call's overhead, and the reads every join
-- shares (the clock, the stock, the holds, the draw's state) once.
--
-- Returns one answer a joiner, in ARGV's order: {code} or, for codes 0
-- and 1, place.lua's place with the code after it (in the table place()
-- makes: no table grown or shifted, 64 times a call). Codes: 0 joined now, 1 in line
-- already (the same place: waiting, or admitted and still holding), 2 not
-- started (before opens_at), 3 ended, 4 sold out (no unit left that is
-- neither sold nor held), 5 already ordered, 6 the stock key is missing
-- (Redis lost it: reload first), 7 Redis refused the write (it is full:
-- try again). Only 0 changes anything. The joiners of
-- one call are answered as if each had come alone, one after the other.
--
-- Times are the Redis server's, like every deadline of the room: which
-- side of begin_time a join falls on is decided by one clock for every
-- instance.
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local begin = tonumber(ARGV[2])
local answers = {}
local function all(code)
  for _ = 4, #ARGV, 2 do
    table.insert(answers, {code})
  end
  return answers
end
if now < tonumber(ARGV[1]) then
  return all(2)
end
if now >= tonumber(ARGV[3]) then
  return all(3)
end
local stock = redis.call('GET', KEYS[6])
if not stock then
  return all(6)
end
-- Units neither sold nor held: the room says sold out, and takes no one
-- more, while there are none. No join below holds a unit, and the ended
-- hold a join removes was not counted here, so it stands for them all.
local free = tonumber(stock) - redis.call('ZCOUNT', KEYS[5], '(' .. now, '+inf')
-- The line's figures (place.lua's room()), kept up to date below as the
-- joins of this call add to them.
local r = room()
-- The draw is open before begin_time, and before the first admission froze
-- it (admit.lua's `drawn`), whatever a clock stepping back says after that.
local drawing = now < begin and not r.frozen

local function answer(code, user, mine, untilMs)
  return place(now, user, begin, free, r, mine, untilMs, false, code)
end

-- Joiners numbered from begin_time on by this call.
local lates = 0

-- Whether anyone bought yet: until someone has (and no one buys before
-- the first admission), no joiner needs looking up among the buyers.
local bought = redis.call('SCARD', KEYS[7]) > 0

-- A new place for user: drawn, or numbered after those before it.
local function placeFor(user, hmac)
  if drawing then
    return 'p:' .. hmac
  end
  return 'l:' .. (r.late + 1)
end

-- Put user in line at the place placeFor gave, once `who` has it.
local function enter(user, hmac)
  if drawing then
    r.drawn = r.drawn + redis.call('ZADD', KEYS[2], 0, hmac .. ':' .. user)
  else
    -- Numbered in the order they come; the count is written once, after
    -- the last joiner of the call (below).
    r.late, lates = r.late + 1, lates + 1
    redis.call('HSET', KEYS[3], r.late, user)
    redis.call('HSET', KEYS[8], user, now)
  end
end

local function join(user, hmac)
  if bought and redis.call('SISMEMBER', KEYS[7], user) == 1 then
    return {5}
  end
  -- The common case, a joiner new to the line, in as few commands as can
  -- be (a command sent from a script costs Redis about a microsecond more
  -- than the command itself): HSETNX gives the place and says whether
  -- one was held already. Who held none holds no hold either (admit.lua
  -- admits only who holds a place, and nothing takes a place away).
  -- Through pcall: a Redis out of memory refuses a script's first write,
  -- and one already in line must still be answered their place (by the
  -- reads below), as before this write came first; a joiner it refused
  -- who needs a place is answered 7, and the call goes on for the rest.
  local refused = false
  if free > 0 then
    local mine = placeFor(user, hmac)
    local set = redis.pcall('HSETNX', KEYS[1], user, mine)
    if set == 1 then
      enter(user, hmac)
      return answer(0, user, mine, -1)
    end
    refused = type(set) == 'table' -- an error reply: {err = ...}
  end
  local mine = redis.call('HGET', KEYS[1], user)
  local untilMs = tonumber(redis.call('ZSCORE', KEYS[5], user) or '-1')
  local ended = untilMs >= 0 and untilMs <= now
  -- In line already: a place, or a hold on, and no hold that ended.
  if not ended and (mine or untilMs >= 0) then
    return answer(1, user, mine, untilMs)
  end
  if free <= 0 then
    return {4}
  end
  if refused then
    -- Before any write: ZREM is one Redis allows when full, and after a
    -- script's first write it checks no more, so the rest of the call
    -- would write too.
    return {7}
  end
  if ended then
    -- A hold that ended without an order: a new place, at the back.
    redis.call('ZREM', KEYS[5], user)
  end
  mine = placeFor(user, hmac)
  redis.call('HSET', KEYS[1], user, mine)
  enter(user, hmac)
  return answer(0, user, mine, -1)
end

for i = 4, #ARGV, 2 do
  table.insert(answers, join(ARGV[i], ARGV[i + 1]))
end
if lates > 0 then
  redis.call('HINCRBY', KEYS[4], 'late', lates)
end
return answers
