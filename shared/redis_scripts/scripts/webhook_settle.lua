-- Ends an attempt: done (its state kept as a tombstone) or due again at a later time. The
-- attempt number is the claim token: a sender whose lease ran out changes nothing.
--
-- KEYS: 1 due zset, 2 delivery hash.
-- ARGV: 1 id, 2 attempt, 3 next due time or '' when done, 4 state.
-- Returns 1 when settled, 0 when the attempt is no longer this sender's.
if redis.call('HGET', KEYS[2], 'attempt') ~= ARGV[2] then return 0 end
if ARGV[3] == '' then
  redis.call('ZREM', KEYS[1], ARGV[1])
  redis.call('HSET', KEYS[2], 'state', ARGV[4])
else
  redis.call('ZADD', KEYS[1], ARGV[3], ARGV[1])
end
return 1
