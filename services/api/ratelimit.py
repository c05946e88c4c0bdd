"""Job submissions per API key: a token bucket in Redis, shared by every API replica."""

import math

from redis.asyncio import Redis

from services.api.auth import Principal
from shared.errors import RateLimited
from shared.names import PREFIX
from shared.settings import Settings

# KEYS: bucket. ARGV: tokens per second, burst, cost.
# Returns '0' when the cost was taken, else the seconds until it could be (as a string: Lua
# numbers come back from Redis truncated to integers).
# Time is the Redis server's, so replicas with skewed clocks still share one bucket fairly.
TOKEN_BUCKET = """
local rate = tonumber(ARGV[1])
local burst = tonumber(ARGV[2])
local cost = tonumber(ARGV[3])
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1000000
local state = redis.call('HMGET', KEYS[1], 'tokens', 'at')
local tokens = tonumber(state[1]) or burst
local at = tonumber(state[2]) or now
tokens = math.min(burst, tokens + math.max(0, now - at) * rate)
local wait = 0
if tokens >= cost then
  tokens = tokens - cost
else
  wait = (cost - tokens) / rate
end
redis.call('HSET', KEYS[1], 'tokens', tokens, 'at', now)
-- Once full again the bucket is the same as no bucket; let it go.
redis.call('PEXPIRE', KEYS[1], math.ceil((burst - tokens) / rate * 1000) + 1000)
return string.format('%.6f', wait)
"""


def bucket_key(principal: Principal) -> str:
    if principal.key_id is not None:
        who = f"key:{principal.key_id}"
    elif principal.client:
        who = f"ip:{principal.client}"
    else:
        who = "anonymous"
    return f"{PREFIX}:ratelimit:{who}"


class RateLimiter:
    def __init__(self, redis: Redis, settings: Settings) -> None:
        self.redis, self.settings = redis, settings
        self._take = redis.register_script(TOKEN_BUCKET)

    async def check(self, principal: Principal) -> None:
        """Take one submission from the caller's bucket, or raise RateLimited."""
        rate = self.settings.rate_limit_per_minute / 60.0
        wait = float(
            await self._take(
                keys=[bucket_key(principal)], args=[rate, self.settings.rate_limit_burst, 1]
            )
        )
        if wait > 0:
            retry_after = max(1, math.ceil(wait))
            raise RateLimited(
                f"rate limit of {self.settings.rate_limit_per_minute:g} job submissions per "
                f"minute (burst {self.settings.rate_limit_burst}) reached; retry in "
                f"{retry_after}s",
                retry_after=retry_after,
            )
