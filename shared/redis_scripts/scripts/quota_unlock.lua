-- Gives a quota lock up only while this request holds it.
--
-- KEYS: 1 the lock.
-- ARGV: 1 the holder's token.
-- Returns 1 when released, else 0.
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0
