-- A line is done: mark it, keep its file line until it is written to a part, and count it,
-- once.
--
-- KEYS: 1 batch, 2 jobs, 3 done (bitmap), 4 lease, 5 lines not yet in a part.
-- ARGV: 1 this replica, 2 line index, 3 the file line, 4 the count to add it to.
-- Returns 1 done now, 0 was done already, -1 when this replica no longer holds the batch's
-- lease.
if redis.call('GET', KEYS[4]) ~= ARGV[1] then return -1 end
redis.call('HDEL', KEYS[2], ARGV[2])
if redis.call('SETBIT', KEYS[3], ARGV[2], 1) == 1 then return 0 end
redis.call('HSET', KEYS[5], ARGV[2], ARGV[3])
redis.call('HINCRBY', KEYS[1], ARGV[4], 1)
return 1
