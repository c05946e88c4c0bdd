"""Lua scripts that make each job-store change atomic in Redis.

A final status (succeeded, failed, canceled) is never left, and a final job's results never
change: every script that writes checks the status first, inside the same atomic step.
"""

_FINAL = """
local function is_final(s)
  return s == 'succeeded' or s == 'failed' or s == 'canceled'
end
"""

# Whether a job's live events are wanted: a live stream watches it (its `watch` field, set by
# WATCH_JOB or at create), or it was stored by an older API (no `r` in its `fin`), whose streams
# expect them all. Events nobody hears are not published.
_WATCHED = """
local function watched(watch, fin)
  return watch == '1' or not string.find(fin or '', 'r', 1, true)
end
"""

# Every time a script decides on (lease expiry, deadlines, what counts as sent long ago) or
# stamps on a job is the Redis server's, never a caller's: API hosts and workers may disagree.
_NOW = """
local function now_seconds()
  local t = redis.call('TIME')
  return tonumber(t[1]) + tonumber(t[2]) / 1000000
end
"""

# What a job's final change does besides its own fields and its announcement (FINALIZE, and
# STORE_RESULT for a job of one sub-request): the record and its webhook deliveries get the
# finished TTL; a `final` stream entry when it wants a `completed` webhook (so that some API
# replica sends it even if the one that finalized dies), and its deadline dropped. `has(c)` says
# what the job has: w webhook deliveries, f a `completed` webhook, d a deadline, r its
# sub-requests' attempts in its record (else, for a job stored by an older API, in a hash of
# their own, given `ran_ttl`).
_CLOSE_JOB = """
local function close_job(job_key, attempts_key, webhooks_key, stream, deadlines, job, ttl,
                         ran_ttl, has)
  redis.call('EXPIRE', job_key, ttl)
  if not has('r') then redis.call('EXPIRE', attempts_key, ran_ttl) end
  if has('w') then redis.call('EXPIRE', webhooks_key, ttl) end
  if has('f') then redis.call('XADD', stream, '*', 'job', job, 'kind', 'final') end
  if has('d') then redis.call('ZREM', deadlines, job) end
end
"""

# A token bucket (rate limits): takes `cost` tokens from the bucket at `key` at time `now` (the
# Redis server's, so replicas with skewed clocks share one bucket fairly), and returns 0, or the
# seconds until they could be taken (then nothing is taken). The bucket is one string, "tokens
# time", read and written with a command each.
_TAKE_TOKENS = """
local function take_tokens(key, now, rate, burst, cost)
  local tokens, at = burst, now
  local state = redis.call('GET', key)
  if state then
    local t, a = string.match(state, '(%S+) (%S+)')
    tokens, at = tonumber(t) or burst, tonumber(a) or now
  end
  tokens = math.min(burst, tokens + math.max(0, now - at) * rate)
  local wait = 0
  if tokens >= cost then
    tokens = tokens - cost
  else
    wait = (cost - tokens) / rate
  end
  -- Once full again the bucket is the same as no bucket; let it go.
  redis.call('SET', key, string.format('%.6f %.6f', tokens, now), 'PX',
             math.ceil((burst - tokens) / rate * 1000) + 1000)
  return wait
end
"""

# KEYS: job, the model's backlog, the owner's jobs index, deadlines, dispatching, the queue's
# priority list, the caller's rate-limit bucket.
# ARGV: job id, the bucket's 'rate burst' (tokens per second; '' for no limit), total, deadline
# in seconds from now ('' for none), index size to trim to ('' not this time), '1' when the
# messages follow ('0': the caller sends them itself), the number n of hash field/value items
# that follow, the n items, then the job's sub-request messages.
# Stores a job and puts its sub-requests in the model's backlog (scored with the time they were
# sent) and, in the same step, either pushes its sub-request messages onto the queue (kombu's
# list for the job's priority), so that a job is never stored half-sent, or, when the caller
# sends them itself, marks the job as being dispatched for the janitor. With a bucket, the job
# first takes a token from it (the rate limit costs no round trip of its own). Returns the time
# it was created; 0 when the job exists already (a retried call stores, sends and takes
# nothing twice); with no token left, the seconds until one is back, negated, and nothing is
# stored.
CREATE_JOB = _NOW + _TAKE_TOKENS + """
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
"""

# KEYS: job, results, attempts, webhooks, completion stream, the model's backlog, deadlines.
# ARGV: status, output json, error json ('' for none), ttl seconds, job id, what else the job
# has ('*': anything; else letters: w webhook deliveries, d a deadline, f a `completed`
# webhook, k outstanding sub-requests), the final channel, the cancel channel, the cancel
# notice, the TTL of what ran it.
# Returns the time it became final (completed_at), 0 if it already was, -1 if gone. In the same
# step:
# - the job's record (and its webhook deliveries) get the finished TTL; its results, needed
#   only while it runs, a short one (the record's output holds every output, and a late
#   sub-result of a final job is refused: STORE_RESULT);
# - a `final` stream entry, when the job wants a `completed` webhook, so that it is sent by some
#   API replica even if the one that finalized dies;
# - every outstanding sub-request of the job leaves the backlog (a final job has none
#   outstanding, whatever its workers still do; a caller that knows every result is stored
#   leaves out `k`: each STORE_RESULT took its own out);
# - the job's id on the final channel (waiters, live event streams) and, unless it succeeded,
#   the cancel notice that makes workers drop what they still run of it.
FINALIZE = (
    _FINAL
    + _NOW
    + _CLOSE_JOB
    + """
local h = redis.call('HMGET', KEYS[1], 'status', 'total', 'fin')
local cur = h[1]
if not cur then return -1 end
if is_final(cur) then return 0 end
local completed = tostring(now_seconds())
if ARGV[3] ~= '' then
  redis.call('HSET', KEYS[1], 'status', ARGV[1], 'output', ARGV[2], 'completed_at', completed,
             'error', ARGV[3])
else
  redis.call('HSET', KEYS[1], 'status', ARGV[1], 'output', ARGV[2], 'completed_at', completed)
end
local all = ARGV[6] == '*'
local function has(c)
  if c == 'r' then return string.find(h[3] or '', 'r', 1, true) ~= nil end
  return all or string.find(ARGV[6], c, 1, true) ~= nil
end
close_job(KEYS[1], KEYS[3], KEYS[4], KEYS[5], KEYS[7], ARGV[5], ARGV[4], ARGV[10], has)
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
redis.call('PUBLISH', ARGV[7], ARGV[5])
if ARGV[1] ~= 'succeeded' then redis.call('PUBLISH', ARGV[8], ARGV[9]) end
return completed
"""
)

# KEYS: job, results, completion stream, leases, the model's backlog, attempts (of a job stored
# by an older API), webhooks, deadlines.
# ARGV: index, result json, job id, ok flag, lease member, worker, the job's events channel and
# an event to publish on it with the result, when its live events are wanted (_WATCHED; '' for
# none: a text's final `output` event goes out only with the result it describes, and before the
# completion that may end the job's event streams), the job's output json when this result may
# end it ('' otherwise), the finished TTL, the TTL of what ran it, the final channel, the
# sub-request's owner field.
# Writes a sub-result once per (job, index) and announces it on the completion stream in the
# same step, so a duplicate delivery can neither change the result nor count twice; the job's
# `done` is the size of its results hash, set in the same step. The sub-request leaves the
# model's backlog, and the worker's lease on it (if it still holds it) is released, in the same
# step.
# With an output, a job of one sub-request (its `fin` field, written at create, says what
# FINALIZE's flags would: w, d, f, r) succeeds in this step instead: what FINALIZE does for it
# (status, output, completed_at, TTLs, its deadline and its `final` stream entry when it has
# them, the final channel), with no sub-result or completion entry written, as the record's
# output holds the one result and no joiner needs to see it.
# Returns 1 when written, 0 for a duplicate, -1 when the job is gone, -2 when it is final; a job
# made final here: {completed_at, created_at, started_at or '', task}.
STORE_RESULT = (
    _FINAL
    + _NOW
    + _CLOSE_JOB
    + _WATCHED
    + """
local h = redis.call('HMGET', KEYS[1], 'status', 'total', 'fin', 'created_at', 'started_at',
                     'task', ARGV[13], 'watch')
local st = h[1]
-- A job that is gone leaves nobody a lease on it worth keeping.
if not st then redis.call('ZREM', KEYS[4], ARGV[5]) return -1 end
local mine = h[7] == ARGV[6]
local publish = ARGV[8] ~= '' and watched(h[8], h[3])
if mine then redis.call('ZREM', KEYS[4], ARGV[5]) end
redis.call('ZREM', KEYS[5], ARGV[5])
if not is_final(st) and ARGV[9] ~= '' and h[2] == '1' and h[3] then
  local completed = tostring(now_seconds())
  if publish then redis.call('PUBLISH', ARGV[7], ARGV[8]) end
  local fields = {'status', 'succeeded', 'output', ARGV[9], 'completed_at', completed, 'done', 1}
  -- Its lease is given up in the same write: an empty owner is no owner.
  if mine then fields[#fields + 1], fields[#fields + 2] = ARGV[13], '' end
  redis.call('HSET', KEYS[1], unpack(fields))
  local function has(c) return string.find(h[3], c, 1, true) ~= nil end
  close_job(KEYS[1], KEYS[6], KEYS[7], KEYS[3], KEYS[8], ARGV[3], ARGV[10], ARGV[11], has)
  redis.call('PUBLISH', ARGV[12], ARGV[3])
  return {completed, h[4], h[5] or '', h[6]}
end
if mine then redis.call('HDEL', KEYS[1], ARGV[13]) end
if is_final(st) then return -2 end
if redis.call('HSETNX', KEYS[2], ARGV[1], ARGV[2]) == 0 then return 0 end
if publish then redis.call('PUBLISH', ARGV[7], ARGV[8]) end
redis.call('HSET', KEYS[1], 'done', redis.call('HLEN', KEYS[2]))
redis.call('XADD', KEYS[3], '*', 'job', ARGV[3], 'kind', 'result', 'index', ARGV[1],
  'ok', ARGV[4])
return 1
"""
)

# A sub-request's lease is its member in the leases zset, scored with when it expires, and its
# owner in its job's record (the field `owner:<index>`; empty or missing: none); the attempts it
# was charged are the record's `attempts:<index>`. Keeping both in the record lets the scripts
# read them with the job's status in one command. Every script that writes to a record first
# checks that it is there, so none makes a record again after it expired.

# KEYS: job, results, leases, completion stream.
# ARGV: index, lease member, worker, lease seconds, max attempts, job id, the owner field, the
# attempts field, the job's events channel, the `running` status event, '1' to charge the
# attempt now.
# The first sub-request to start moves the job to running and publishes its status event; it
# announces the start on the completion stream only when the job wants a `start` webhook (its
# `hooks` field names the webhook events it wants; a job stored without one gets the entry).
# A lease costs no attempt: an attempt is charged when the sub-request starts on the device
# (CHARGE_ATTEMPTS), so a worker lost while merely holding it costs it nothing. A worker whose
# engine has room for it at once (it joins the next decode iteration) asks for the charge with
# the lease instead, in the same write, and then makes no charge round trip before the device
# runs it.
# Returns {status, detail}: 'acquired' (the attempt it becomes if it runs), 'done', 'final',
# 'gone', 'busy' (a live lease: another delivery runs it now) or 'exhausted' (attempts used);
# 'acquired' adds '1' when the job's live events are wanted (_WATCHED), else '0'.
ACQUIRE_LEASE = (
    _FINAL
    + _NOW
    + _WATCHED
    + """
local h = redis.call('HMGET', KEYS[1], 'status', 'hooks', 'total', 'done', ARGV[7], ARGV[8],
                     'watch', 'fin')
local st = h[1]
if not st then return {'gone', ''} end
if is_final(st) then return {'final', st} end
-- A job of one sub-request has its result exactly when its `done` says so (STORE_RESULT sets
-- both in one step); a job stored before `done` was kept is asked its results.
if h[3] == '1' and h[4] then
  if h[4] ~= '0' then return {'done', ''} end
elseif redis.call('HEXISTS', KEYS[2], ARGV[1]) == 1 then
  return {'done', ''}
end
local now = now_seconds()
-- A live lease means some delivery is running it now (on this worker or another); one the
-- janitor holds while it sends the sub-request again is this delivery's to take.
local owner = h[5] or ''
if owner ~= '' and string.sub(owner, 1, 8) ~= 'janitor:' then
  local exp = redis.call('ZSCORE', KEYS[3], ARGV[2])
  if exp and tonumber(exp) > now then return {'busy', owner} end
end
local n = tonumber(h[6] or '0')
if n >= tonumber(ARGV[5]) then return {'exhausted', tostring(n)} end
local live = watched(h[7], h[8])
redis.call('ZADD', KEYS[3], now + tonumber(ARGV[4]), ARGV[2])
local fields = {ARGV[7], ARGV[3]}
if ARGV[11] == '1' then fields[3], fields[4] = ARGV[8], n + 1 end
-- started_at is set with the first move out of queued, and no script moves a job back.
local first = st == 'queued'
if first then
  fields[#fields + 1], fields[#fields + 2] = 'status', 'running'
  fields[#fields + 1], fields[#fields + 2] = 'started_at', tostring(now)
end
redis.call('HSET', KEYS[1], unpack(fields))
if first then
  if live then redis.call('PUBLISH', ARGV[9], ARGV[10]) end
  if not h[2] or string.find(h[2], 'start', 1, true) then
    redis.call('XADD', KEYS[4], '*', 'job', ARGV[6], 'kind', 'started')
  end
end
return {'acquired', tostring(n + 1), live and '1' or '0'}
"""
)

# KEYS: each member's job. ARGV: worker, then each member's owner field and attempts field.
# A batch is about to start on the device: each of its sub-requests that this worker still
# leases is charged one attempt. Only what starts is charged, so when a worker is lost only what
# it was running pays for it (a poison sub-request that crashes its worker still runs out of
# attempts). A member whose job is final or gone is not charged. Returns how many were charged.
CHARGE_ATTEMPTS = (
    _FINAL
    + """
local n = 0
for i = 1, #KEYS do
  local h = redis.call('HMGET', KEYS[i], 'status', ARGV[2 * i])
  if h[1] and not is_final(h[1]) and h[2] == ARGV[1] then
    redis.call('HINCRBY', KEYS[i], ARGV[2 * i + 1], 1)
    n = n + 1
  end
end
return n
"""
)

# KEYS: leases, then each member's job. ARGV: worker, lease seconds, then each member and its
# owner field.
# Renews only the leases this worker still owns (the janitor may have taken one away).
RENEW_LEASES = (
    _NOW
    + """
local expiry = now_seconds() + tonumber(ARGV[2])
local n = 0
for i = 2, #KEYS do
  if redis.call('HGET', KEYS[i], ARGV[2 * i]) == ARGV[1] then
    redis.call('ZADD', KEYS[1], 'XX', expiry, ARGV[2 * i - 1])
    n = n + 1
  end
end
return n
"""
)

# KEYS: leases, the member's job. ARGV: member, worker, owner field.
# Gives a lease up if `worker` holds it; a lease on a job that is gone goes whoever held it.
RELEASE_LEASE = """
local owner = redis.call('HGET', KEYS[2], ARGV[3])
if owner == ARGV[2] then
  redis.call('ZREM', KEYS[1], ARGV[1])
  redis.call('HDEL', KEYS[2], ARGV[3])
  return 1
end
if not owner and redis.call('EXISTS', KEYS[2]) == 0 then redis.call('ZREM', KEYS[1], ARGV[1]) end
return 0
"""

# KEYS: leases, the member's job. ARGV: member, worker, hand-back owner, owner field, attempts
# field, '1' when it was charged an attempt while this worker held it.
# A draining worker gives a lease up: expired for every clock and renamed, so its heartbeat can
# no longer renew it and a new delivery takes it at once; the attempt it was charged is given
# back (a drain is not a lost worker). Returns 1 when this worker held the lease, else 0.
HAND_BACK_LEASE = """
local h = redis.call('HMGET', KEYS[2], ARGV[4], ARGV[5])
if h[1] ~= ARGV[2] then return 0 end
redis.call('ZADD', KEYS[1], 0, ARGV[1])
local fields = {ARGV[4], ARGV[3]}
if ARGV[6] == '1' and tonumber(h[2] or '0') > 0 then
  fields[3], fields[4] = ARGV[5], tonumber(h[2]) - 1
end
redis.call('HSET', KEYS[2], unpack(fields))
return 1
"""

# KEYS: leases. ARGV: limit. The members whose lease has expired, the earliest first (read only:
# CLAIM_EXPIRED takes them, told their jobs' records).
EXPIRED_LEASES = (
    _NOW
    + """
return redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', now_seconds(), 'LIMIT', 0, ARGV[1])
"""
)

# KEYS: leases, then the job of each candidate. ARGV: janitor owner ('janitor:<replica>'), hold
# seconds, then each candidate member and its owner field (EXPIRED_LEASES' answer).
# Takes the candidates' expired leases over atomically, so exactly one janitor (of several API
# replicas) handles each: the janitor holds the lease while it sends the sub-request again (so
# the orphan sweep leaves it alone) and gives it up after; a delivery may take a janitor's lease
# at once (ACQUIRE_LEASE). Should the janitor die first, its lease expires and is taken over
# again. A lease on a job that is gone is dropped. Returns the members taken.
CLAIM_EXPIRED = (
    _NOW
    + """
local now = now_seconds()
local taken = {}
for i = 2, #KEYS do
  local m = ARGV[2 * i - 1]
  local exp = redis.call('ZSCORE', KEYS[1], m)
  if exp and tonumber(exp) <= now then
    if redis.call('EXISTS', KEYS[i]) == 0 then
      redis.call('ZREM', KEYS[1], m)
    else
      redis.call('ZADD', KEYS[1], now + tonumber(ARGV[2]), m)
      redis.call('HSET', KEYS[i], ARGV[2 * i], ARGV[1])
      taken[#taken + 1] = m
    end
  end
end
return taken
"""
)

# KEYS: a model's backlog. ARGV: members...
# The janitor is about to send these sub-requests again: they count as sent now.
MARK_SENT = (
    _NOW
    + """
local now = now_seconds()
local n = 0
for i = 1, #ARGV do
  n = n + redis.call('ZADD', KEYS[1], 'XX', 'CH', now, ARGV[i])
end
return n
"""
)

# KEYS: a model's backlog, leases. ARGV: member, the backlog score the caller read.
# A sub-request the lost-work sweep found outstanding, unleased, and in no queue: taken for
# sending again by exactly one caller, only if nobody sent it again (its score) or leased it
# since the caller looked. It counts as sent now. Returns 1 when taken, else 0.
CLAIM_LOST = (
    _NOW
    + """
local sent = redis.call('ZSCORE', KEYS[1], ARGV[1])
if not sent or tonumber(sent) ~= tonumber(ARGV[2]) then return 0 end
if redis.call('ZSCORE', KEYS[2], ARGV[1]) then return 0 end
redis.call('ZADD', KEYS[1], 'XX', now_seconds(), ARGV[1])
return 1
"""
)

# KEYS: a zset of ids scored with a time. ARGV: age, retry seconds, limit.
# The ids whose score is at least `age` seconds past, each pushed `retry` seconds later in the
# same step: one caller (of several API replicas) takes each now, and an id its caller never
# finished with (it died, or the work failed) is due again after `retry`. The work itself
# removes the id when done (FINALIZE for deadlines, `mark_dispatched` for dispatches).
CLAIM_DUE = (
    _NOW
    + """
local cutoff = now_seconds() - tonumber(ARGV[1])
local ids = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', cutoff, 'LIMIT', 0, ARGV[3])
for _, id in ipairs(ids) do
  redis.call('ZADD', KEYS[1], 'XX', cutoff + tonumber(ARGV[2]), id)
end
return ids
"""
)

# KEYS: job. ARGV: the watch channel, job id.
# A live event stream begins to watch a job that is not final: from now on the scripts publish
# its events, and the workers that run it, told on the watch channel, theirs. Returns 1, or 0
# for a job that is final or gone (nothing is written).
WATCH_JOB = (
    _FINAL
    + """
local st = redis.call('HGET', KEYS[1], 'status')
if not st or is_final(st) then return 0 end
redis.call('HSET', KEYS[1], 'watch', '1')
redis.call('PUBLISH', ARGV[1], ARGV[2])
return 1
"""
)

# Webhook outbox (services/api/webhooks/outbox.py) -------------------------------------------

# KEYS: due zset, delivery hash. ARGV: id, job, event, now, ttl.
WEBHOOK_ENQUEUE = """
if redis.call('EXISTS', KEYS[2]) == 1 then return 0 end
redis.call('HSET', KEYS[2], 'job', ARGV[2], 'event', ARGV[3], 'attempt', 0,
           'first_at', ARGV[4], 'state', 'pending')
redis.call('EXPIRE', KEYS[2], ARGV[5])
redis.call('ZADD', KEYS[1], ARGV[4], ARGV[1])
return 1
"""

# KEYS: due zset, delivery hash. ARGV: id, now, lease until, consumer.
WEBHOOK_TAKE = """
local due = redis.call('ZSCORE', KEYS[1], ARGV[1])
if not due or tonumber(due) > tonumber(ARGV[2]) then return false end
if redis.call('EXISTS', KEYS[2]) == 0 then
  redis.call('ZREM', KEYS[1], ARGV[1])
  return false
end
redis.call('ZADD', KEYS[1], ARGV[3], ARGV[1])
local attempt = redis.call('HINCRBY', KEYS[2], 'attempt', 1)
redis.call('HSET', KEYS[2], 'owner', ARGV[4])
local h = redis.call('HMGET', KEYS[2], 'job', 'event', 'first_at')
return {attempt, h[1], h[2], h[3]}
"""

# KEYS: due zset, delivery hash. ARGV: id, attempt, next due time or '' when done, state.
WEBHOOK_SETTLE = """
if redis.call('HGET', KEYS[2], 'attempt') ~= ARGV[2] then return 0 end
if ARGV[3] == '' then
  redis.call('ZREM', KEYS[1], ARGV[1])
  redis.call('HSET', KEYS[2], 'state', ARGV[4])
else
  redis.call('ZADD', KEYS[1], ARGV[3], ARGV[1])
end
return 1
"""

# KEYS: due zset, delivery hash. ARGV: id, attempt, now. Hands an interrupted claim back.
WEBHOOK_RELEASE = """
if redis.call('HGET', KEYS[2], 'attempt') ~= ARGV[2] then return 0 end
redis.call('HINCRBY', KEYS[2], 'attempt', -1)
redis.call('ZADD', KEYS[1], ARGV[3], ARGV[1])
return 1
"""

# Rate limiting (services/api/ratelimit.py) ----------------------------------------------------

# KEYS: key. ARGV: expected value, new value ('' to delete).
# Changes a value only if it is still the one the caller read (Idempotency-Key claims: a request
# never frees or overwrites a claim another request made in the meantime). Returns 1 or 0.
SWAP_IF_EQUAL = """
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return 0 end
if ARGV[2] == '' then
  redis.call('DEL', KEYS[1])
else
  redis.call('SET', KEYS[1], ARGV[2], 'KEEPTTL')
end
return 1
"""
