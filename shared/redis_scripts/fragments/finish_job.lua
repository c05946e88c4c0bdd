-- The one place a job becomes final: finalize.lua, and store_result.lua for a job of one
-- sub-request, both make it final here, so a final job has the same shape whichever path ended
-- it. In one step:
-- - its final fields in one HSET: status, output, completed_at (the Redis server's time), the
--   error when there is one, and the caller's `more` field/value pairs (a write it would
--   otherwise make to the record in a command of its own);
-- - the record and its webhook deliveries get the finished TTL; what ran it (the attempts hash
--   of a job stored by an older API) the short one;
-- - a `final` stream entry when it wants a `completed` webhook (so that some API replica sends
--   it even if the one that finalized dies), and its deadline dropped;
-- - its id on the final channel (waiters, live event streams);
-- - its owner's usage counts it under its final status, when the caller passes `job.usage`.
-- `job.has(c)` says what the job has: w webhook deliveries, f a `completed` webhook, d a
-- deadline, r its sub-requests' attempts in its record (else, for a job stored by an older API,
-- in a hash of their own). Returns completed_at.
--@include now
--@include usage
local function finish_job(job)
  local completed = tostring(now_seconds())
  local fields = {'status', job.status, 'output', job.output, 'completed_at', completed}
  if job.error ~= '' then fields[#fields + 1], fields[#fields + 2] = 'error', job.error end
  for _, v in ipairs(job.more) do fields[#fields + 1] = v end
  redis.call('HSET', job.key, unpack(fields))
  redis.call('EXPIRE', job.key, job.ttl)
  if not job.has('r') then redis.call('EXPIRE', job.attempts_key, job.ran_ttl) end
  if job.has('w') then redis.call('EXPIRE', job.webhooks_key, job.ttl) end
  if job.has('f') then redis.call('XADD', job.stream, '*', 'job', job.id, 'kind', 'final') end
  if job.has('d') then redis.call('ZREM', job.deadlines, job.id) end
  redis.call('PUBLISH', job.final_channel, job.id)
  usage_add(job.usage, {'jobs_' .. job.status, 1})
  return completed
end
