"""The Redis server's clock, for the decisions that every replica must make alike (is a claim
abandoned, is an hour past its retention): hosts' clocks drift apart, the one Redis they share
does not disagree with itself. Scripts read the same clock inside Lua
(shared/redis_scripts/fragments/now.lua)."""

import redis.asyncio as aioredis


async def redis_now(redis: aioredis.Redis) -> float:
    """Seconds since the epoch by the Redis server's clock (TIME)."""
    seconds, micros = await redis.time()
    return seconds + micros / 1_000_000
