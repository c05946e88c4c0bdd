-- Writes a sub-result once per (job, index) and announces it on the completion stream in the
-- same step, so a duplicate delivery can neither change the result nor count twice; the job's
-- `done` is the size of its results hash, set in the same step. The sub-request leaves the
-- model's backlog, and the worker's lease on it (if it still holds it) is released, in the same
-- step, and so are its owner's usage (its tokens, images and device time: usage.lua) and its
-- model's finished count (count_finished.lua) counted: once, with its first write.
-- With an output, a job of one sub-request (its `fin` field, written at create, says what
-- finalize.lua's flags would: w, d, f, r) succeeds in this step instead, through finish_job
-- (the one place a job becomes final: status, output, completed_at, TTLs, its deadline and its
-- `final` stream entry when it has them, the final channel), with no sub-result or completion
-- entry written, as the record's output holds the one result and no joiner needs to see it.
--
-- KEYS: 1 job, 2 results, 3 completion stream, 4 leases, 5 the model's backlog, 6 attempts (of
-- a job stored by an older API), 7 webhooks, 8 deadlines.
-- ARGV: 1 index, 2 result json, 3 job id, 4 ok flag, 5 lease member, 6 worker, 7 the job's
-- events channel and 8 an event to publish on it with the result, when its live events are
-- wanted (watched; '' for none: a text's final `output` event goes out only with the result it
-- describes, and before the completion that may end the job's event streams), 9 the job's
-- output json when this result may end it ('' otherwise), 10 the finished TTL, 11 the TTL of
-- what ran it, 12 the final channel, 13 the sub-request's owner field, 14 the usage counters'
-- TTL, 15 its usage ('prompt_tokens completion_tokens images device_ms'), 16 the finished
-- count's 'bucket ttl', 17 the sub-request's ran field and 18 its value ('started finished
-- worker', for the job's timeline: written with the result, in a write made anyway; absent from
-- an older worker's call).
-- Returns 1 when written, 0 for a duplicate, -1 when the job is gone, -2 when it is final; a job
-- made final here: {completed_at, created_at, started_at or '', task}.
--@include is_final
--@include watched
--@include finish_job
--@include count_finished
local h = redis.call('HMGET', KEYS[1], 'status', 'total', 'fin', 'created_at', 'started_at',
                     'task', ARGV[13], 'watch', 'model', 'meta')
local st = h[1]
-- A job that is gone leaves nobody a lease on it worth keeping.
if not st then redis.call('ZREM', KEYS[4], ARGV[5]) return -1 end
local mine = h[7] == ARGV[6]
local publish = ARGV[8] ~= '' and watched(h[8], h[3])
if mine then redis.call('ZREM', KEYS[4], ARGV[5]) end
redis.call('ZREM', KEYS[5], ARGV[5])
local function count_usage()
  local u = usage_of(h[10], h[9], ARGV[14])
  local p, c, i, d = string.match(ARGV[15], '(%S+) (%S+) (%S+) (%S+)')
  usage_add(u, {'prompt_tokens', p, 'completion_tokens', c, 'images', i, 'device_ms', d})
  count_finished(h[9] or '', ARGV[16], u.now)
  return u
end
if not is_final(st) and ARGV[9] ~= '' and h[2] == '1' and h[3] then
  if publish then redis.call('PUBLISH', ARGV[7], ARGV[8]) end
  local more = {'done', 1}
  -- Its lease is given up in the same write: an empty owner is no owner.
  if mine then more[3], more[4] = ARGV[13], '' end
  if ARGV[17] then more[#more + 1], more[#more + 2] = ARGV[17], ARGV[18] end
  local completed = finish_job({
    key = KEYS[1], id = ARGV[3], status = 'succeeded', output = ARGV[9], error = '',
    more = more, attempts_key = KEYS[6], webhooks_key = KEYS[7], stream = KEYS[3],
    deadlines = KEYS[8], ttl = ARGV[10], ran_ttl = ARGV[11], final_channel = ARGV[12],
    has = function(c) return string.find(h[3], c, 1, true) ~= nil end,
    usage = count_usage(),
  })
  return {completed, h[4], h[5] or '', h[6]}
end
if mine then redis.call('HDEL', KEYS[1], ARGV[13]) end
if is_final(st) then return -2 end
if redis.call('HSETNX', KEYS[2], ARGV[1], ARGV[2]) == 0 then return 0 end
if publish then redis.call('PUBLISH', ARGV[7], ARGV[8]) end
count_usage()
if ARGV[17] then
  redis.call('HSET', KEYS[1], 'done', redis.call('HLEN', KEYS[2]), ARGV[17], ARGV[18])
else
  redis.call('HSET', KEYS[1], 'done', redis.call('HLEN', KEYS[2]))
end
redis.call('XADD', KEYS[3], '*', 'job', ARGV[3], 'kind', 'result', 'index', ARGV[1],
  'ok', ARGV[4])
return 1
