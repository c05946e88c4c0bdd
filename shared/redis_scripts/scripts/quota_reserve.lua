-- Reserves a batch line's sub-requests in its key's share of a model's queue, unless the key's
-- batch work outstanding there would pass its limit. A line larger than the limit is let in
-- alone (when nothing else of the key's is outstanding), so that no line waits for ever.
--
-- KEYS: 1 the key's batch work on the model (zset member -> ms reserved at), 2 its total.
-- ARGV: 1 member ("<sub-requests>:<job id>"), 2 sub-requests, 3 limit, 4 now (ms),
--       5 seconds the keys are kept after the last reservation.
-- Returns -1 when reserved (or reserved already), else the total outstanding.
local total = tonumber(redis.call('GET', KEYS[2]) or '0')
local n = tonumber(ARGV[2])
if redis.call('ZSCORE', KEYS[1], ARGV[1]) then return -1 end
if total > 0 and total + n > tonumber(ARGV[3]) then return total end
redis.call('ZADD', KEYS[1], ARGV[4], ARGV[1])
redis.call('INCRBY', KEYS[2], n)
redis.call('EXPIRE', KEYS[1], ARGV[5])
redis.call('EXPIRE', KEYS[2], ARGV[5])
return -1
