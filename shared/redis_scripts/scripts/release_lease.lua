-- Gives a lease up if `worker` holds it; a lease on a job that is gone goes whoever held it.
--
-- KEYS: 1 leases, 2 the member's job.
-- ARGV: 1 member, 2 worker, 3 owner field.
-- Returns 1 when this worker held it, else 0.
local owner = redis.call('HGET', KEYS[2], ARGV[3])
if owner == ARGV[2] then
  redis.call('ZREM', KEYS[1], ARGV[1])
  redis.call('HDEL', KEYS[2], ARGV[3])
  return 1
end
if not owner and redis.call('EXISTS', KEYS[2]) == 0 then redis.call('ZREM', KEYS[1], ARGV[1]) end
return 0
