-- Usage counters (GET /v1/usage, shared/usage.py): per API key (`_open` on an open API) and UTC
-- day by the Redis server's clock, a hash `fm:usage:{key}:{YYYYMMDD}` of `model|metric`
-- counts, kept `ttl` seconds after its last change. They are counted only at steps that happen
-- once: a sub-result's first write (store_result.lua) and a job becoming final
-- (finish_job.lua), so a redelivery or a retry after a lost worker never counts twice.
-- `usage_of` takes the job record's `meta` (its owner) and `model`, as the caller read them;
-- its `now` is the time it read, for the caller to reuse.
--@include now
--@include utc_day
local function usage_of(meta, model, ttl)
  -- The owner is a top-level string of the meta JSON (a key id: hex digits). Matched, not
  -- decoded: decoding the whole meta cost more than the rest of the counting. A quote inside
  -- a JSON string is escaped, so no value can fake the `"owner":"` that starts the field.
  local owner = meta and string.match(meta, '"owner":"([^"]+)"') or '_open'
  local now = now_seconds()
  return {key = 'fm:usage:' .. owner .. ':' .. utc_day(now), model = model or '', ttl = ttl,
          now = now}
end

-- Adds `counts` (metric, n, metric, n...) to `u` (usage_of); a nil `u` counts nothing. The TTL
-- is set with the first add of a script, however many follow.
local function usage_add(u, counts)
  if not u then return end
  local added = false
  for i = 1, #counts, 2 do
    local n = tonumber(counts[i + 1]) or 0
    if n ~= 0 then
      redis.call('HINCRBY', u.key, u.model .. '|' .. counts[i], n)
      added = true
    end
  end
  if added and not u.expires then
    redis.call('EXPIRE', u.key, u.ttl)
    u.expires = true
  end
end
