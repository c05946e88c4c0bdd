"""Lua scripts that make each job-store change atomic in Redis.

A final status (succeeded, failed, canceled) is never left, and a final job's results never
change: every script that writes checks the status first, inside the same atomic step.
"""

_FINAL = """
local function is_final(s)
  return s == 'succeeded' or s == 'failed' or s == 'canceled'
end
"""

# KEYS: job. ARGV: to, timestamp field ('' for none), timestamp, allowed from-statuses...
# Returns {1, to} on change, {0, current} when refused, {-1} when the job does not exist.
TRANSITION = (
    _FINAL
    + """
local cur = redis.call('HGET', KEYS[1], 'status')
if not cur then return {-1} end
if is_final(cur) then return {0, cur} end
for i = 4, #ARGV do
  if cur == ARGV[i] then
    redis.call('HSET', KEYS[1], 'status', ARGV[1])
    if ARGV[2] ~= '' then redis.call('HSETNX', KEYS[1], ARGV[2], ARGV[3]) end
    return {1, ARGV[1]}
  end
end
return {0, cur}
"""
)

# KEYS: job, results, blobs, attempts, webhooks, completion stream, the model's backlog.
# ARGV: status, output json, error json ('' for none), completed_at, ttl seconds, job id, stream
# maxlen. Returns 1 when the job became final, 0 if it already was, -1 if gone. The `final`
# stream entry is written in the same step, so whatever must follow a final state (the
# `completed` webhook) is done by some API replica even if the one that finalized dies.
# Every sub-request of the job leaves the backlog in the same step: a final job has none
# outstanding, whatever its workers still do.
FINALIZE = (
    _FINAL
    + """
local cur = redis.call('HGET', KEYS[1], 'status')
if not cur then return -1 end
if is_final(cur) then return 0 end
redis.call('HSET', KEYS[1], 'status', ARGV[1], 'output', ARGV[2], 'completed_at', ARGV[4])
if ARGV[3] ~= '' then redis.call('HSET', KEYS[1], 'error', ARGV[3]) end
for i = 1, 5 do redis.call('EXPIRE', KEYS[i], ARGV[5]) end
redis.call('XADD', KEYS[6], 'MAXLEN', '~', ARGV[7], '*', 'job', ARGV[6], 'kind', 'final')
local total = tonumber(redis.call('HGET', KEYS[1], 'total') or '0') or 0
local members = {}
for i = 0, total - 1 do
  members[#members + 1] = ARGV[6] .. ':' .. i
  if #members == 256 then  -- unpack() has a stack limit: remove in chunks
    redis.call('ZREM', KEYS[7], unpack(members))
    members = {}
  end
end
if #members > 0 then redis.call('ZREM', KEYS[7], unpack(members)) end
return 1
"""
)

# KEYS: job, results, blobs, stream, leases, owners, the model's backlog.
# ARGV: index, result json, blob ('' for none), job id, ok flag, stream maxlen, lease member,
# worker.
# Writes a sub-result once per (job, index) and announces it on the completion stream in the
# same step, so a duplicate delivery can neither change the result nor count twice. The
# sub-request leaves the model's backlog in the same step.
# Returns 1 when written, 0 for a duplicate, -1 when the job is gone, -2 when it is final.
STORE_RESULT = (
    _FINAL
    + """
local st = redis.call('HGET', KEYS[1], 'status')
if redis.call('HGET', KEYS[6], ARGV[7]) == ARGV[8] then
  redis.call('ZREM', KEYS[5], ARGV[7])
  redis.call('HDEL', KEYS[6], ARGV[7])
end
if not st then return -1 end
redis.call('ZREM', KEYS[7], ARGV[7])
if is_final(st) then return -2 end
if redis.call('HEXISTS', KEYS[2], ARGV[1]) == 1 then return 0 end
if ARGV[3] ~= '' then redis.call('HSET', KEYS[3], ARGV[1], ARGV[3]) end
redis.call('HSET', KEYS[2], ARGV[1], ARGV[2])
redis.call('XADD', KEYS[4], 'MAXLEN', '~', ARGV[6], '*',
  'job', ARGV[4], 'kind', 'result', 'index', ARGV[1], 'ok', ARGV[5])
return 1
"""
)

# KEYS: job, results, leases, owners, attempts, completion stream.
# ARGV: index, lease member, worker, now, lease expiry, max attempts, job id, stream maxlen.
# The first sub-request to start moves the job to running and announces it on the stream.
# Returns {status, detail}: 'acquired' (attempt number), 'done', 'final', 'gone',
# 'busy' (a live lease: another delivery runs it now) or 'exhausted' (attempt number).
ACQUIRE_LEASE = (
    _FINAL
    + """
local st = redis.call('HGET', KEYS[1], 'status')
if not st then return {'gone', ''} end
if is_final(st) then return {'final', st} end
if redis.call('HEXISTS', KEYS[2], ARGV[1]) == 1 then return {'done', ''} end
-- A live lease means some delivery is running it now (on this worker or another).
local exp = redis.call('ZSCORE', KEYS[3], ARGV[2])
if exp and tonumber(exp) > tonumber(ARGV[4]) then
  return {'busy', redis.call('HGET', KEYS[4], ARGV[2]) or ''}
end
local n = redis.call('HINCRBY', KEYS[5], ARGV[1], 1)
if n > tonumber(ARGV[6]) then return {'exhausted', tostring(n)} end
redis.call('ZADD', KEYS[3], ARGV[5], ARGV[2])
redis.call('HSET', KEYS[4], ARGV[2], ARGV[3])
if st == 'queued' then
  redis.call('HSET', KEYS[1], 'status', 'running')
  redis.call('HSETNX', KEYS[1], 'started_at', ARGV[4])
  redis.call('XADD', KEYS[6], 'MAXLEN', '~', ARGV[8], '*', 'job', ARGV[7], 'kind', 'started')
end
return {'acquired', tostring(n)}
"""
)

# KEYS: leases, owners. ARGV: worker, expiry, members...
# Renews only the leases this worker still owns (the janitor may have taken one away).
RENEW_LEASES = """
local n = 0
for i = 3, #ARGV do
  if redis.call('HGET', KEYS[2], ARGV[i]) == ARGV[1] then
    redis.call('ZADD', KEYS[1], 'XX', ARGV[2], ARGV[i])
    n = n + 1
  end
end
return n
"""

# KEYS: leases, owners. ARGV: member, worker.
RELEASE_LEASE = """
if redis.call('HGET', KEYS[2], ARGV[1]) == ARGV[2] then
  redis.call('ZREM', KEYS[1], ARGV[1])
  redis.call('HDEL', KEYS[2], ARGV[1])
  return 1
end
return 0
"""

# KEYS: leases, owners, attempts. ARGV: member, worker, hand-back owner, index.
# A draining worker gives a lease up: expired for every clock and renamed, so its heartbeat can
# no longer renew it and a new delivery takes it at once; the attempt it used is given back (a
# drain is not a lost worker). Returns 1 when this worker held the lease, else 0.
HAND_BACK_LEASE = """
if redis.call('HGET', KEYS[2], ARGV[1]) ~= ARGV[2] then return 0 end
redis.call('ZADD', KEYS[1], 0, ARGV[1])
redis.call('HSET', KEYS[2], ARGV[1], ARGV[3])
if tonumber(redis.call('HGET', KEYS[3], ARGV[4]) or '0') > 0 then
  redis.call('HINCRBY', KEYS[3], ARGV[4], -1)
end
return 1
"""

# KEYS: leases, owners. ARGV: now, limit.
# Takes expired leases away atomically, so exactly one janitor (of several API replicas)
# handles each.
CLAIM_EXPIRED = """
local members = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', ARGV[1], 'LIMIT', 0, ARGV[2])
for _, m in ipairs(members) do
  redis.call('ZREM', KEYS[1], m)
  redis.call('HDEL', KEYS[2], m)
end
return members
"""
