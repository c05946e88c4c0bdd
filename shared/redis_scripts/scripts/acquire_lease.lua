-- A sub-request's lease is its member in the leases zset, scored with when it expires, and its
-- owner in its job's record (the field `owner:<index>`; empty or missing: none); the attempts it
-- was charged are the record's `attempts:<index>`. Keeping both in the record lets the scripts
-- read them with the job's status in one command. Every script that writes to a record first
-- checks that it is there, so none makes a record again after it expired.
--
-- The first sub-request to start moves the job to running and publishes its status event; it
-- announces the start on the completion stream only when the job wants a `start` webhook (its
-- `hooks` field names the webhook events it wants; a job stored without one gets the entry).
-- A lease costs no attempt: an attempt is charged when the sub-request starts on the device
-- (charge_attempts.lua), so a worker lost while merely holding it costs it nothing. A worker
-- whose engine has room for it at once (it joins the next decode iteration) asks for the charge
-- with the lease instead, in the same write, and then makes no charge round trip before the
-- device runs it.
--
-- KEYS: 1 job, 2 results, 3 leases, 4 completion stream.
-- ARGV: 1 index, 2 lease member, 3 worker, 4 lease seconds, 5 max attempts, 6 job id, 7 the
-- owner field, 8 the attempts field, 9 the job's events channel, 10 the `running` status event,
-- 11 '1' to charge the attempt now, 12 the leased field (when the lease was taken, for the job's
-- timeline; absent from an older worker's call).
-- Returns {status, detail}: 'acquired' (the attempt it becomes if it runs), 'done', 'final',
-- 'gone', 'busy' (a live lease: another delivery runs it now) or 'exhausted' (attempts used);
-- 'acquired' adds '1' when the job's live events are wanted (watched), else '0'.
--@include is_final
--@include now
--@include watched
local h = redis.call('HMGET', KEYS[1], 'status', 'hooks', 'total', 'done', ARGV[7], ARGV[8],
                     'watch', 'fin')
local st = h[1]
if not st then return {'gone', ''} end
if is_final(st) then return {'final', st} end
-- A job of one sub-request has its result exactly when its `done` says so (store_result.lua
-- sets both in one step); a job stored before `done` was kept is asked its results.
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
if ARGV[12] then fields[#fields + 1], fields[#fields + 2] = ARGV[12], tostring(now) end
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
