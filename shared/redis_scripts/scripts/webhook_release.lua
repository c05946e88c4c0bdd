-- Hands an interrupted claim back: its attempt number back down, due again now.
--
-- KEYS: 1 due zset, 2 delivery hash.
-- ARGV: 1 id, 2 attempt, 3 now.
-- Returns 1 when handed back, 0 when the attempt is no longer this sender's.
if redis.call('HGET', KEYS[2], 'attempt') ~= ARGV[2] then return 0 end
redis.call('HINCRBY', KEYS[2], 'attempt', -1)
redis.call('ZADD', KEYS[1], ARGV[3], ARGV[1])
return 1
