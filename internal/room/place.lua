-- place(now, user, begin, free, r, mine, untilMs, ordered, code): one user's
-- place in a voucher's waiting room, and the room's figures, as of one
-- moment. Not a script alone: the scripts that answer a place (read.lua,
-- join.lua) begin with it.
--
-- KEYS[1] who   KEYS[2] pre   KEYS[4] state   KEYS[5] admitted
-- KEYS[6] stock KEYS[7] buyers (join.lua's; KEYS[3], late, is not read)
-- now: the Redis server's clock (ms)   user: user ID ('' for the room's
-- figures alone)   begin: begin_time (ms). The rest is what the caller
-- (join.lua) has read already in the same script, so that it is not read
-- again, or nil where it has not (read.lua passes none of them):
--   free     units neither sold nor held
--   r        {serving, drawn, frozen} as below, the draw's count included
--   mine     the user's entry in `who` (false: none)
--   untilMs  the end of the user's hold, in ms (-1: none)
--   ordered  whether the user holds an order
--   code     join.lua's answer code, put after the place (nil: none)
-- They are arguments, not a table of them: join.lua answers up to 64
-- joiners a call, and a table a joiner was a tenth of a join's cost.
--
-- Returns {state, number, serving, until, free, total, now}, and code after
-- them when given:
--   state   'none', 'waiting', 'admitted', 'expired' or 'ordered'; or
--           'missing' when the voucher's stock key is (the rest is void)
--   number  the user's number; -1 while it is not drawn yet
--   serving the highest number admitted so far
--   until   the end of the user's hold, in ms (-1: none)
--   free    units neither sold nor held (<= 0: the room is sold out)
--   total   numbers given so far (those above serving are waiting)
--   now     the Redis server's clock, in ms

-- room(): the line's figures: serving, drawn (the draw's size: frozen at
-- the first admission, else counted now), frozen, late (numbers given
-- from begin_time on).
local function room()
  local st = redis.call('HMGET', KEYS[4], 'serving', 'drawn', 'late')
  local r = {serving = tonumber(st[1] or '0'), drawn = tonumber(st[2] or '-1'), late = tonumber(st[3] or '0')}
  r.frozen = r.drawn >= 0
  if not r.frozen then
    r.drawn = redis.call('ZCARD', KEYS[2])
  end
  return r
end

local function place(now, user, begin, free, r, mine, untilMs, ordered, code)
  r = r or room()
  if free == nil then
    local stock = redis.call('GET', KEYS[6])
    if not stock then
      -- Redis lost the voucher's keys: no figure at all, rather than a
      -- stock of 0 that would tell every waiter sold out.
      return {'missing', -1, 0, -1, 0, 0, now}
    end
    free = tonumber(stock) - redis.call('ZCOUNT', KEYS[5], '(' .. now, '+inf')
  end
  local state, number = 'none', -1
  if user ~= '' then
    if mine == nil then
      mine = redis.call('HGET', KEYS[1], user)
    end
    if untilMs == nil then
      untilMs = tonumber(redis.call('ZSCORE', KEYS[5], user) or '-1')
    end
    if mine then
      if string.sub(mine, 1, 2) == 'l:' then
        number = r.drawn + tonumber(string.sub(mine, 3))
      elseif now >= begin or r.frozen then
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
    if ordered == nil then
      ordered = redis.call('SISMEMBER', KEYS[7], user) == 1
    end
    if ordered then
      state = 'ordered'
    end
  end
  return {state, number, r.serving, untilMs or -1, free, r.drawn + r.late, now, code}
end
