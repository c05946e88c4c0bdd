-- Takes the candidates' expired leases over atomically, so exactly one janitor (of several API
-- replicas) handles each: the janitor holds the lease while it sends the sub-request again (so
-- the orphan sweep leaves it alone) and gives it up after; a delivery may take a janitor's lease
-- at once (acquire_lease.lua). Should the janitor die first, its lease expires and is taken over
-- again. A lease on a job that is gone is dropped.
--
-- KEYS: 1 leases, then the job of each candidate.
-- ARGV: 1 janitor owner ('janitor:<replica>'), 2 hold seconds, then each candidate member and
-- its owner field (expired_leases.lua's answer).
-- Returns the members taken.
--@include now
local now = now_seconds()
local taken = {}
for i = 2, #KEYS do
  local m = ARGV[2 * i - 1]
  local exp = redis.call('ZSCORE', KEYS[1], m)
  if exp and tonumber(exp) <= now then
    if redis.call('EXISTS', KEYS[i]) == 0 then
      redis.call('ZREM', KEYS[1], m)
    else
      redis.call('ZADD', KEYS[1], now + tonumber(ARGV[2]), m)
      redis.call('HSET', KEYS[i], ARGV[2 * i], ARGV[1])
      taken[#taken + 1] = m
    end
  end
end
return taken
