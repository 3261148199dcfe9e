-- Check a login code once.
--
-- KEYS[1] the code's hash: code, tries
-- ARGV[1] the code offered
-- ARGV[2] how many wrong tries burn the code
--
-- Returns 1 if the code matched (and deletes it: a code logs in once),
-- 0 otherwise. In one script so that two requests with the right code
-- cannot both log in, and guesses are counted without a race.
local code = redis.call('HGET', KEYS[1], 'code')
if not code then
  return 0
end
if code == ARGV[1] then
  redis.call('DEL', KEYS[1])
  return 1
end
if redis.call('HINCRBY', KEYS[1], 'tries', 1) >= tonumber(ARGV[2]) then
  redis.call('DEL', KEYS[1])
end
return 0
