-- Where a queued job stands, in one step: its first sub-request's rank in its model's backlog
-- (outstanding sub-requests in the order they were sent: waiting, prefetched or running), the
-- backlog's size, how many wait in the queue's priority lists more urgent than the job's, in
-- its own, and in all, the Redis server's time, and the model's recent finished counts
-- (count_finished.lua), newest bucket first.
--
-- KEYS: 1 the model's backlog, 2.. the queue's priority lists, most urgent first.
-- ARGV: 1 the job's first sub-request (member), 2 the model, 3 the bucket's seconds, 4 how many
-- buckets to read, 5 the job's own list (its place among KEYS[2..], from 1).
-- Returns {rank or -1 when it is not in the backlog, backlog size, waiting more urgent, waiting
-- in its own list, waiting in all, now, count of the current bucket, of the one before, ...}.
--@include now
local rank = redis.call('ZRANK', KEYS[1], ARGV[1])
local size = redis.call('ZCARD', KEYS[1])
local own = tonumber(ARGV[5])
local urgent, same, all = 0, 0, 0
for i = 2, #KEYS do
  local n = redis.call('LLEN', KEYS[i])
  all = all + n
  if i - 1 < own then urgent = urgent + n elseif i - 1 == own then same = n end
end
local now = now_seconds()
local bucket = math.floor(now / tonumber(ARGV[3]))
local keys = {}
for i = 0, tonumber(ARGV[4]) - 1 do
  keys[#keys + 1] = 'fm:finished:' .. ARGV[2] .. ':' .. (bucket - i)
end
local out = {rank or -1, size, urgent, same, all, tostring(now)}
for _, v in ipairs(redis.call('MGET', unpack(keys))) do out[#out + 1] = tonumber(v) or 0 end
return out
