-- A batch is about to start on the device: each of its sub-requests that this worker still
-- leases is charged one attempt. Only what starts is charged, so when a worker is lost only what
-- it was running pays for it (a poison sub-request that crashes its worker still runs out of
-- attempts). A member whose job is final or gone is not charged.
--
-- KEYS: each member's job.
-- ARGV: 1 worker, then each member's owner field and attempts field.
-- Returns how many were charged.
--@include is_final
local n = 0
for i = 1, #KEYS do
  local h = redis.call('HMGET', KEYS[i], 'status', ARGV[2 * i])
  if h[1] and not is_final(h[1]) and h[2] == ARGV[1] then
    redis.call('HINCRBY', KEYS[i], ARGV[2 * i + 1], 1)
    n = n + 1
  end
end
return n
