-- Moves a batch from one of the allowed statuses to another, stamping the time on Redis's
-- clock (so that replicas whose clocks disagree stamp alike) and setting the field/value pairs
-- that follow.
--
-- KEYS: 1 batch.
-- ARGV: 1 the allowed statuses (comma-separated), 2 the new status, 3 the field that gets the
-- time in seconds ('' none), then field/value pairs.
-- Returns 1 when it moved, 0 when its status was another, -1 when there is no batch.
local status = redis.call('HGET', KEYS[1], 'status')
if not status then return -1 end
local allowed = false
for s in string.gmatch(ARGV[1], '[^,]+') do
  if s == status then allowed = true end
end
if not allowed then return 0 end
redis.call('HSET', KEYS[1], 'status', ARGV[2])
if ARGV[3] ~= '' then redis.call('HSET', KEYS[1], ARGV[3], redis.call('TIME')[1]) end
for i = 4, #ARGV, 2 do redis.call('HSET', KEYS[1], ARGV[i], ARGV[i + 1]) end
return 1
