-- A draining worker gives a lease up: expired for every clock and renamed, so its heartbeat can
-- no longer renew it and a new delivery takes it at once; the attempt it was charged is given
-- back (a drain is not a lost worker).
--
-- KEYS: 1 leases, 2 the member's job.
-- ARGV: 1 member, 2 worker, 3 hand-back owner, 4 owner field, 5 attempts field, 6 '1' when it
-- was charged an attempt while this worker held it.
-- Returns 1 when this worker held the lease, else 0.
local h = redis.call('HMGET', KEYS[2], ARGV[4], ARGV[5])
if h[1] ~= ARGV[2] then return 0 end
redis.call('ZADD', KEYS[1], 0, ARGV[1])
local fields = {ARGV[4], ARGV[3]}
if ARGV[6] == '1' and tonumber(h[2] or '0') > 0 then
  fields[3], fields[4] = ARGV[5], tonumber(h[2]) - 1
end
redis.call('HSET', KEYS[2], unpack(fields))
return 1
