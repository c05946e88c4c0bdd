-- Gives the batch lease up only while this replica holds it.
--
-- KEYS: 1 lease.
-- ARGV: 1 this replica.
-- Returns 1 when released, else 0.
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0
