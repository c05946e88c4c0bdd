-- Rotates one API key's webhook signing secret: the current one keeps signing beside the new
-- one for the overlap, then goes, so receivers can move to the new one without a delivery
-- failing in between. Only the newest rotated-out ones are kept (each signs every delivery).
--
-- KEYS: 1 the key's secrets (as in webhook_secrets.lua).
-- ARGV: 1 the new secret, 2 the overlap (seconds), 3 the most rotated-out secrets kept.
-- Returns what webhook_secrets.lua returns, after the rotation.
--@include now
local now = now_seconds()
local ends = now + tonumber(ARGV[2])
for _, current in ipairs(redis.call('ZRANGEBYSCORE', KEYS[1], '+inf', '+inf')) do
  redis.call('ZADD', KEYS[1], ends, current)
end
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
redis.call('ZADD', KEYS[1], 'inf', ARGV[1])
redis.call('ZREMRANGEBYRANK', KEYS[1], 0, -(tonumber(ARGV[3]) + 2))
return redis.call('ZREVRANGE', KEYS[1], 0, -1, 'WITHSCORES')
