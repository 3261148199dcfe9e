-- Queue an order in one atomic step: take a unit of the voucher, remember
-- the buyer, append the order to the stream and mark it pending. A new
-- order (Accept) and a dead letter put back in the queue (Replay) go
-- through this one script: a replay is a new acceptance under the old
-- order ID, because the dead letter's settlement gave its unit back and
-- forgot its buyer.
--
-- KEYS[1] stock    KEYS[2] buyers   (package stock's keys of the voucher,
--         or of one bucket of a split voucher)
-- KEYS[3] the orders stream         KEYS[4] the pending-orders hash
-- KEYS[5] the bucket's accepted orders: user -> order ID
-- KEYS[6] the bucket's count of orders in the stream not yet written
-- KEYS[7] a new order: its request's void mark (see lost.lua);
--         a replay: the dead letters
-- KEYS[8] the bucket's claims (package stock's: user -> deadline, buyers
--         whose unit is being taken in another bucket)
-- KEYS[9] the waiting room's admitted buyers (package stock's Admitted:
--         user -> end of their hold in ms; empty without a room)
-- ARGV[1] user ID   ARGV[2] voucher ID   ARGV[3] time accepted, in ms
-- ARGV[4] the order's ID (a decimal string: Lua numbers cannot hold 63 bits)
-- ARGV[5] a replay: the dead letter's entry ID; a new order: ''
-- ARGV[6] the voucher's buckets   ARGV[7] this bucket
-- ARGV[8] '': the buyer is checked and remembered here (their home
--         bucket, or a voucher not split); otherwise the buyer was
--         claimed in their home bucket (another slot: package stock's
--         Claim), and this is the last moment, in ms by this server's
--         clock, at which the unit may be taken for that claim
-- ARGV[9] '1': the voucher has a waiting room: only a buyer whose
--         admission has not ended may take a unit, and taking it ends
--         the admission (a room's voucher is never split). A replay
--         takes only a unit that no admitted buyer holds.
--
-- Returns 0 queued, 1 sold out, 2 already bought (the user holds an
-- order), 3 stock key missing (reload it, then try again), 4 a new
-- order's request was declared lost before it ran (its caller was already
-- answered), 5 no such dead letter (replayed already), 6 the claim is too
-- old (see ARGV[8]), 7 another request of the user holds a claim here (it
-- may yet fail, and the user buy again), 8 not admitted by the voucher's
-- waiting room. Only 0 changes anything.
--
-- Taking the unit, remembering the user and appending the order in one
-- script means there is no moment at which one has happened without the
-- others: an accepted order cannot be lost between Redis keys.
local replay = ARGV[5] ~= '' and ARGV[5]
if replay then
  if #redis.call('XRANGE', KEYS[7], replay, replay) == 0 then
    return 5
  end
elseif redis.call('EXISTS', KEYS[7]) == 1 then
  return 4
end
local claimed = ARGV[8] ~= ''
if claimed then
  local t = redis.call('TIME')
  if tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000) > tonumber(ARGV[8]) then
    return 6
  end
end
local stock = redis.call('GET', KEYS[1])
if not stock then
  return 3
end
-- The buyer before the stock, as in take.lua: a buyer of a split voucher
-- whose home is empty must hear "already bought" here, or they would go
-- on to look at every other bucket and claim.
if not claimed and redis.call('SISMEMBER', KEYS[2], ARGV[1]) == 1 then
  if redis.call('ZSCORE', KEYS[8], ARGV[1]) then
    return 7
  end
  return 2
end
local room = ARGV[9] == '1'
if room then
  local t = redis.call('TIME')
  local untilMs = redis.call('ZSCORE', KEYS[9], ARGV[1])
  if not untilMs or tonumber(untilMs) <= tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000) then
    return 8
  end
end
local free = tonumber(stock)
if replay then
  -- A replayed dead letter takes a unit only if none of it is held by a
  -- buyer a waiting room admitted (the dead letter's unit went back on
  -- sale, and the room may have given it to the next number since): an
  -- admitted buyer is never told sold out. Without a room, nobody is.
  local t = redis.call('TIME')
  free = free - redis.call('ZCOUNT', KEYS[9], '(' .. (tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)), '+inf')
end
if free <= 0 then
  return 1
end
local id = ARGV[4]
if room then
  -- The order is accepted: the hold on its unit ends, in the same step.
  -- The entry stays, ended (score 0): if the order is dead-lettered and
  -- the buyer forgotten, their place reads as a hold that ended, and they
  -- may join the room again.
  redis.call('ZADD', KEYS[9], 'XX', 0, ARGV[1])
end
redis.call('DECR', KEYS[1])
if not claimed then
  redis.call('SADD', KEYS[2], ARGV[1])
end
if ARGV[6] == '1' then
  redis.call('XADD', KEYS[3], '*', 'id', id, 'user', ARGV[1], 'voucher', ARGV[2], 'at', ARGV[3])
else
  redis.call('XADD', KEYS[3], '*', 'id', id, 'user', ARGV[1], 'voucher', ARGV[2], 'at', ARGV[3],
    'buckets', ARGV[6], 'bucket', ARGV[7])
end
redis.call('HSET', KEYS[4], id, ARGV[1] .. ':' .. ARGV[2] .. ':' .. ARGV[3] .. ':pending')
redis.call('HSET', KEYS[5], ARGV[1], id)
redis.call('INCR', KEYS[6])
if replay then
  redis.call('XDEL', KEYS[7], replay)
end
return 0
