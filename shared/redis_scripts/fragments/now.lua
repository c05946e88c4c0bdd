-- Every time a script decides on (lease expiry, deadlines, what counts as sent long ago) or
-- stamps on a job is the Redis server's, never a caller's: API hosts and workers may disagree.
local function now_seconds()
  local t = redis.call('TIME')
  return tonumber(t[1]) + tonumber(t[2]) / 1000000
end
