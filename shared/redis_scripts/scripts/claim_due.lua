-- The ids whose score is at least `age` seconds past, each pushed `retry` seconds later in the
-- same step: one caller (of several API replicas) takes each now, and an id its caller never
-- finished with (it died, or the work failed) is due again after `retry`. The work itself
-- removes the id when done (finalize.lua for deadlines, `mark_dispatched` for dispatches).
--
-- KEYS: 1 a zset of ids scored with a time.
-- ARGV: 1 age, 2 retry seconds, 3 limit.
-- Returns the ids taken.
--@include now
local cutoff = now_seconds() - tonumber(ARGV[1])
local ids = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', cutoff, 'LIMIT', 0, ARGV[3])
for _, id in ipairs(ids) do
  redis.call('ZADD', KEYS[1], 'XX', cutoff + tonumber(ARGV[2]), id)
end
return ids
