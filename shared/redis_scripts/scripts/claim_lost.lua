-- A sub-request the lost-work sweep found outstanding, unleased, and in no queue: taken for
-- sending again by exactly one caller, only if nobody sent it again (its score) or leased it
-- since the caller looked. It counts as sent now.
--
-- KEYS: 1 a model's backlog, 2 leases.
-- ARGV: 1 member, 2 the backlog score the caller read.
-- Returns 1 when taken, else 0.
--@include now
local sent = redis.call('ZSCORE', KEYS[1], ARGV[1])
if not sent or tonumber(sent) ~= tonumber(ARGV[2]) then return 0 end
if redis.call('ZSCORE', KEYS[2], ARGV[1]) then return 0 end
redis.call('ZADD', KEYS[1], 'XX', now_seconds(), ARGV[1])
return 1
