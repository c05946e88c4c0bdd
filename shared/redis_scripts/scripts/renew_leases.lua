-- Renews only the leases this worker still owns (the janitor may have taken one away).
--
-- KEYS: 1 leases, then each member's job.
-- ARGV: 1 worker, 2 lease seconds, then each member and its owner field.
-- Returns how many were renewed.
--@include now
local expiry = now_seconds() + tonumber(ARGV[2])
local n = 0
for i = 2, #KEYS do
  if redis.call('HGET', KEYS[i], ARGV[2 * i]) == ARGV[1] then
    redis.call('ZADD', KEYS[1], 'XX', expiry, ARGV[2 * i - 1])
    n = n + 1
  end
end
return n
