-- Sets a final status with its output once. In the same step (finish_job, the one place a job
-- becomes final, does the first three):
-- - the job's record (and its webhook deliveries) get the finished TTL; its results, needed
--   only while it runs, a short one (the record's output holds every output, and a late
--   sub-result of a final job is refused: store_result.lua);
-- - a `final` stream entry, when the job wants a `completed` webhook, so that it is sent by some
--   API replica even if the one that finalized dies;
-- - the job's id on the final channel (waiters, live event streams);
-- - every outstanding sub-request of the job leaves the backlog (a final job has none
--   outstanding, whatever its workers still do; a caller that knows every result is stored
--   leaves out `k`: each store_result.lua took its own out);
-- - unless it succeeded, the cancel notice that makes workers drop what they still run of it;
-- - its owner's usage counts the job under its final status (usage.lua).
--
-- KEYS: 1 job, 2 results, 3 attempts, 4 webhooks, 5 completion stream, 6 the model's backlog,
-- 7 deadlines.
-- ARGV: 1 status, 2 output json, 3 error json ('' for none), 4 ttl seconds, 5 job id, 6 what
-- else the job has ('*': anything; else letters: w webhook deliveries, d a deadline, f a
-- `completed` webhook, k outstanding sub-requests), 7 the final channel, 8 the cancel channel,
-- 9 the cancel notice, 10 the TTL of what ran it, 11 the usage counters' TTL.
-- Returns the time it became final (completed_at), 0 if it already was, -1 if gone.
--@include is_final
--@include finish_job
local h = redis.call('HMGET', KEYS[1], 'status', 'total', 'fin', 'model', 'meta')
local cur = h[1]
if not cur then return -1 end
if is_final(cur) then return 0 end
local all = ARGV[6] == '*'
local function has(c)
  if c == 'r' then return string.find(h[3] or '', 'r', 1, true) ~= nil end
  return all or string.find(ARGV[6], c, 1, true) ~= nil
end
local completed = finish_job({
  key = KEYS[1], id = ARGV[5], status = ARGV[1], output = ARGV[2], error = ARGV[3], more = {},
  attempts_key = KEYS[3], webhooks_key = KEYS[4], stream = KEYS[5], deadlines = KEYS[7],
  ttl = ARGV[4], ran_ttl = ARGV[10], has = has, final_channel = ARGV[7],
  usage = usage_of(h[5], h[4], ARGV[11]),
})
redis.call('EXPIRE', KEYS[2], ARGV[10])
if has('k') then
  local total = tonumber(h[2] or '0') or 0
  local members = {}
  for i = 0, total - 1 do
    members[#members + 1] = ARGV[5] .. ':' .. i
    if #members == 256 then  -- unpack() has a stack limit: remove in chunks
      redis.call('ZREM', KEYS[6], unpack(members))
      members = {}
    end
  end
  if #members > 0 then redis.call('ZREM', KEYS[6], unpack(members)) end
end
if ARGV[1] ~= 'succeeded' then redis.call('PUBLISH', ARGV[8], ARGV[9]) end
return completed
