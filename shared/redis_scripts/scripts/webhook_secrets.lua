-- The secrets that sign one API key's webhooks, the first one made on first use: the current
-- one, and those rotated out that still sign beside it until their time ends.
--
-- KEYS: 1 the key's secrets (zset: secret -> when it stops signing, in seconds; inf: current).
-- ARGV: 1 a new secret, made the current one when the key has none.
-- Returns {secret, until, ...}: the current one first (until 'inf'), then the newest first.
--@include now
local now = now_seconds()
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
if redis.call('ZCOUNT', KEYS[1], '+inf', '+inf') == 0 then
  redis.call('ZADD', KEYS[1], 'inf', ARGV[1])
end
return redis.call('ZREVRANGE', KEYS[1], 0, -1, 'WITHSCORES')
