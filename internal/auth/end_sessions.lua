-- End every session of a user ("log out everywhere"): their tokens issued
-- before the second this returns are void (Tokens.Verify compares a
-- token's iat with it).
--
-- KEYS[1] the user's key: the first second from which their tokens count
-- KEYS[2] the stream of logouts, which every instance reads (sessions.go)
-- ARGV[1] the user ID
-- ARGV[2] now, in Unix seconds (the instance's clock, which also writes
--         the iat of the tokens it issues)
-- ARGV[3] the longest a token lives (auth.MaxTTL), in seconds
--
-- Returns the new second. It is past now, so that a token issued earlier
-- in this very second is void too; and past the one already stored, since
-- a token issued after an earlier logout of this second got that one as
-- its iat (Tokens.Issue). Read and write are one step, so that two
-- logouts at once cannot both read the old second and write the same new
-- one; and the stream gets the logout in the same step, so that no
-- instance can miss one that was made. The key lives, and the stream
-- keeps its entries, until every token they void has expired anyway.
local now = tonumber(ARGV[2])
local old = tonumber(redis.call('GET', KEYS[1]) or '0')
local from = math.max(now + 1, old + 1)
redis.call('SET', KEYS[1], string.format('%d', from), 'EX', from - now + tonumber(ARGV[3]))
redis.call('XADD', KEYS[2], 'MINID', '~', string.format('%d', (now - tonumber(ARGV[3])) * 1000), '*',
  'user', ARGV[1], 'from', string.format('%d', from))
return from
