-- The janitor is about to send these sub-requests again: they count as sent now.
--
-- KEYS: 1 a model's backlog.
-- ARGV: members...
-- Returns how many scores changed.
--@include now
local now = now_seconds()
local n = 0
for i = 1, #ARGV do
  n = n + redis.call('ZADD', KEYS[1], 'XX', 'CH', now, ARGV[i])
end
return n
