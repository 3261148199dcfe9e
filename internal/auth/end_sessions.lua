-- End every session of a user ("log out everywhere"): their tokens issued
-- before the second this returns are void (Tokens.Verify compares a
-- token's iat with it).
--
-- KEYS[1] the user's key: the first second from which their tokens count
-- ARGV[1] now, in Unix seconds (the instance's clock, which also writes
--         the iat of the tokens it issues)
-- ARGV[2] the longest a token lives (auth.MaxTTL), in seconds
--
-- Returns the new second. It is past now, so that a token issued earlier
-- in this very second is void too; and past the one already stored, since
-- a token issued after an earlier logout of this second got that one as
-- its iat (Tokens.Issue). Read and write are one step, so that two
-- logouts at once cannot both read the old second and write the same new
-- one. The key lives until every token it voids has expired anyway.
local now = tonumber(ARGV[1])
local old = tonumber(redis.call('GET', KEYS[1]) or '0')
local from = math.max(now + 1, old + 1)
redis.call('SET', KEYS[1], string.format('%d', from), 'EX', from - now + tonumber(ARGV[2]))
return from
