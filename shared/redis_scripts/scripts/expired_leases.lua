-- The members whose lease has expired, the earliest first (read only: claim_expired.lua takes
-- them, told their jobs' records).
--
-- KEYS: 1 leases.
-- ARGV: 1 limit.
--@include now
return redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', now_seconds(), 'LIMIT', 0, ARGV[1])
