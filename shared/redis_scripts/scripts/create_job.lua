-- Stores a job and puts its sub-requests in the model's backlog (scored with the time they were
-- sent) and, in the same step, either pushes its sub-request messages onto the queue (kombu's
-- list for the job's priority), so that a job is never stored half-sent, or, when the caller
-- sends them itself, marks the job as being dispatched for the janitor. With a bucket, the job
-- first takes a token from it (the rate limit costs no round trip of its own).
--
-- KEYS: 1 job, 2 the model's backlog, 3 the owner's jobs index, 4 deadlines, 5 dispatching,
-- 6 the queue's priority list, 7 the caller's rate-limit bucket.
-- ARGV: 1 job id, 2 the bucket's 'rate burst' (tokens per second; '' for no limit), 3 total,
-- 4 deadline in seconds from now ('' for none), 5 index size to trim to ('' not this time),
-- 6 '1' when the messages follow ('0': the caller sends them itself), 7 the number n of hash
-- field/value items that follow, 8.. the n items, then the job's sub-request messages.
-- Returns the time it was created; 0 when the job exists already (a retried call stores, sends
-- and takes nothing twice); with no token left, the seconds until one is back, negated, and
-- nothing is stored.
--@include now
--@include take_tokens
if redis.call('EXISTS', KEYS[1]) == 1 then return 0 end
local n = tonumber(ARGV[7])
local now, job = now_seconds(), ARGV[1]
if ARGV[2] ~= '' then
  local rate, burst = string.match(ARGV[2], '(%S+) (%S+)')
  local wait = take_tokens(KEYS[7], now, tonumber(rate), tonumber(burst), 1)
  if wait > 0 then return string.format('-%.6f', wait) end
end
redis.call('HSET', KEYS[1], 'created_at', tostring(now), unpack(ARGV, 8, 7 + n))
local members = {}
for i = 0, tonumber(ARGV[3]) - 1 do
  members[#members + 1] = now
  members[#members + 1] = job .. ':' .. i
  if #members == 512 then  -- unpack() has a stack limit: add in chunks
    redis.call('ZADD', KEYS[2], unpack(members))
    members = {}
  end
end
if #members > 0 then redis.call('ZADD', KEYS[2], unpack(members)) end
if ARGV[4] ~= '' then redis.call('ZADD', KEYS[4], now + tonumber(ARGV[4]), job) end
redis.call('ZADD', KEYS[3], now, job)
if ARGV[5] ~= '' then redis.call('ZREMRANGEBYRANK', KEYS[3], 0, -tonumber(ARGV[5]) - 1) end
if ARGV[6] ~= '1' then
  redis.call('ZADD', KEYS[5], now, job)
  return tostring(now)
end
for i = 8 + n, #ARGV, 256 do
  redis.call('LPUSH', KEYS[6], unpack(ARGV, i, math.min(i + 255, #ARGV)))
end
return tostring(now)
