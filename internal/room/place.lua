-- place(now, user, begin): one user's place in a voucher's waiting room,
-- and the room's figures, as of one moment. Not a script alone: the
-- scripts that answer a place (read.lua, join.lua) begin with it.
--
-- KEYS[1] who   KEYS[2] pre   KEYS[4] state   KEYS[5] admitted
-- KEYS[6] stock KEYS[7] buyers (join.lua's; KEYS[3], late, is not read)
-- now: the Redis server's clock (ms)   user: user ID ('' for the room's
-- figures alone)   begin: begin_time (ms)   joined: nil, or join.lua's
-- {mine = the place it just gave, free = units neither sold nor held},
-- which it read already: a joiner just placed holds nothing and has no
-- order, so neither is read again.
--
-- Returns {state, number, serving, until, free, total, now}:
--   state   'none', 'waiting', 'admitted', 'expired' or 'ordered'
--   number  the user's number; -1 while it is not drawn yet
--   serving the highest number admitted so far
--   until   the end of the user's hold, in ms (-1: none)
--   free    units neither sold nor held (<= 0: the room is sold out)
--   total   numbers given so far (those above serving are waiting)
--   now     the Redis server's clock, in ms
local function place(now, user, begin, joined)
  local st = redis.call('HMGET', KEYS[4], 'serving', 'drawn', 'late')
  local serving = tonumber(st[1] or '0')
  local drawn = tonumber(st[2] or '-1')
  local frozen = drawn >= 0
  if not frozen then
    drawn = redis.call('ZCARD', KEYS[2])
  end
  local total = drawn + tonumber(st[3] or '0')
  local free
  if joined then
    free = joined.free
  else
    local stock = tonumber(redis.call('GET', KEYS[6]) or '0')
    free = stock - redis.call('ZCOUNT', KEYS[5], '(' .. now, '+inf')
  end
  local state, number, untilMs = 'none', -1, -1
  if user ~= '' then
    local mine
    if joined then
      mine = joined.mine -- no hold, no order: join.lua checked
    else
      mine = redis.call('HGET', KEYS[1], user)
      local u = redis.call('ZSCORE', KEYS[5], user)
      if u then
        untilMs = tonumber(u)
      end
    end
    if mine then
      if string.sub(mine, 1, 2) == 'l:' then
        number = drawn + tonumber(string.sub(mine, 3))
      elseif now >= begin or frozen then
        local rank = redis.call('ZRANK', KEYS[2], string.sub(mine, 3) .. ':' .. user)
        if rank then
          number = rank + 1
        end
      end
      if untilMs < 0 then
        state = 'waiting'
      elseif untilMs > now then
        state = 'admitted'
      else
        state = 'expired'
      end
    end
    if not joined and redis.call('SISMEMBER', KEYS[7], user) == 1 then
      state = 'ordered'
    end
  end
  return {state, number, serving, untilMs, free, total, now}
end
