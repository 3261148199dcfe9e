-- fair_line.lua is the fair lock's line, shared by fair_obtain.lua and
-- fair_release.lua (scripts.go puts it in front of each; a script sent to
-- Redis is one text).
--
-- first returns the first in line that is still alive, after removing the
-- waiters whose time in line ran out (by now, Redis' clock in ms). An
-- entry of the line that has no time at all should not exist; it would
-- block the line forever, so it goes too.
local function first(queue, alive, now)
  for _, dead in ipairs(redis.call('ZRANGEBYSCORE', alive, '-inf', now)) do
    redis.call('LREM', queue, 1, dead)
  end
  redis.call('ZREMRANGEBYSCORE', alive, '-inf', now)
  while true do
    local h = redis.call('LINDEX', queue, 0)
    if not h or redis.call('ZSCORE', alive, h) then
      return h
    end
    redis.call('LPOP', queue)
  end
end

