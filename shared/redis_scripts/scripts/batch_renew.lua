-- Extends the batch lease only while this replica holds it.
--
-- KEYS: 1 lease.
-- ARGV: 1 this replica, 2 lease milliseconds.
-- Returns 1 when renewed, else 0.
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('PEXPIRE', KEYS[1], ARGV[2])
end
return 0
