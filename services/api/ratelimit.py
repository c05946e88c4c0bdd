"""Job submissions per API key: a token bucket in Redis, shared by every API replica."""

import math

from redis.asyncio import Redis

from services.api.auth import Principal
from shared.errors import RateLimited
from shared.lua import TOKEN_BUCKET
from shared.names import ratelimit_key
from shared.settings import Settings


def bucket_key(principal: Principal) -> str:
    if principal.key_id is not None:
        who = f"key:{principal.key_id}"
    elif principal.client:
        who = f"ip:{principal.client}"
    else:
        who = "anonymous"
    return ratelimit_key(who)


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
