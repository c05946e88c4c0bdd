-- A live event stream begins to watch a job that is not final: from now on the scripts publish
-- its events, and the workers that run it, told on the watch channel, theirs.
--
-- KEYS: 1 job.
-- ARGV: 1 the watch channel, 2 job id.
-- Returns 1, or 0 for a job that is final or gone (nothing is written).
--@include is_final
local st = redis.call('HGET', KEYS[1], 'status')
if not st or is_final(st) then return 0 end
redis.call('HSET', KEYS[1], 'watch', '1')
redis.call('PUBLISH', ARGV[1], ARGV[2])
return 1
