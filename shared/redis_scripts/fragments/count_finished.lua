-- A sub-request of `model` finished (its result was written once): counted in the bucket of
-- `bucket` seconds it finished in, by the Redis server's clock (`fm:finished:{model}:{n}`, n
-- the bucket's number, kept `ttl` seconds). A queued job's estimated start reads the recent
-- buckets (queue_position.lua). `spec` is 'bucket ttl'; `now` the server's time, as read.
local function count_finished(model, spec, now)
  local bucket, ttl = string.match(spec, '(%S+) (%S+)')
  local key = 'fm:finished:' .. model .. ':' .. math.floor(now / tonumber(bucket))
  if redis.call('INCR', key) == 1 then redis.call('EXPIRE', key, ttl) end
end
