-- Claims a due delivery: its due time moves forward by a lease and its attempt number goes up,
-- so exactly one replica sends each attempt. A delivery whose hash expired leaves the zset.
--
-- KEYS: 1 due zset, 2 delivery hash.
-- ARGV: 1 id, 2 now, 3 lease until, 4 consumer.
-- Returns {attempt, job, event, first_at}, or nil when it is not due (or gone).
local due = redis.call('ZSCORE', KEYS[1], ARGV[1])
if not due or tonumber(due) > tonumber(ARGV[2]) then return false end
if redis.call('EXISTS', KEYS[2]) == 0 then
  redis.call('ZREM', KEYS[1], ARGV[1])
  return false
end
redis.call('ZADD', KEYS[1], ARGV[3], ARGV[1])
local attempt = redis.call('HINCRBY', KEYS[2], 'attempt', 1)
redis.call('HSET', KEYS[2], 'owner', ARGV[4])
local h = redis.call('HMGET', KEYS[2], 'job', 'event', 'first_at')
return {attempt, h[1], h[2], h[3]}
