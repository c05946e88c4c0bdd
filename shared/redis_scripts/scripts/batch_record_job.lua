-- A line was submitted as a job.
--
-- KEYS: 1 jobs, 2 done (bitmap), 3 lease.
-- ARGV: 1 this replica, 2 line index, 3 job id.
-- Returns 1 when recorded, 0 when the line is done already, -1 when the lease is lost.
if redis.call('GET', KEYS[3]) ~= ARGV[1] then return -1 end
if redis.call('GETBIT', KEYS[2], ARGV[2]) == 1 then return 0 end
redis.call('HSET', KEYS[1], ARGV[2], ARGV[3])
return 1
