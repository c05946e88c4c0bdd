-- Records a webhook delivery once: a second enqueue of the same delivery id (another replica,
-- or the same event again) finds its hash and adds nothing.
--
-- KEYS: 1 due zset, 2 delivery hash.
-- ARGV: 1 id, 2 job, 3 event, 4 now, 5 ttl.
-- Returns 1 when added, 0 when it was there already.
if redis.call('EXISTS', KEYS[2]) == 1 then return 0 end
redis.call('HSET', KEYS[2], 'job', ARGV[2], 'event', ARGV[3], 'attempt', 0,
           'first_at', ARGV[4], 'state', 'pending')
redis.call('EXPIRE', KEYS[2], ARGV[5])
redis.call('ZADD', KEYS[1], ARGV[4], ARGV[1])
return 1
