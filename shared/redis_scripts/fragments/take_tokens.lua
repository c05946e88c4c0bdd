-- A token bucket (rate limits): takes `cost` tokens from the bucket at `key` at time `now` (the
-- Redis server's, so replicas with skewed clocks share one bucket fairly), and returns 0, or the
-- seconds until they could be taken (then nothing is taken). The bucket is one string, "tokens
-- time", read and written with a command each.
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
