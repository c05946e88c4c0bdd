-- A line is done: keep its file line once and count it.
--
-- KEYS: 1 batch, 2 jobs, 3 done, 4 lease.
-- ARGV: 1 this replica, 2 line index, 3 the file line, 4 the count to add it to.
-- Returns 1 done now, 0 was done already, -1 when this replica no longer holds the batch's
-- lease.
if redis.call('GET', KEYS[4]) ~= ARGV[1] then return -1 end
redis.call('HDEL', KEYS[2], ARGV[2])
if redis.call('HSETNX', KEYS[3], ARGV[2], ARGV[3]) == 0 then return 0 end
redis.call('HINCRBY', KEYS[1], ARGV[4], 1)
return 1
