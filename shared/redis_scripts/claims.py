"""Wrapper of scripts/swap_if_equal.lua (Idempotency-Key claims)."""

import redis.asyncio as aioredis

from shared import redis_replies as replies
from shared.redis_scripts.loader import Script

SWAP_IF_EQUAL = Script("swap_if_equal")


async def swap_if_equal(redis: aioredis.Redis, *, key: str, expected: str, new: str) -> bool:
    """Set `key` to `new` (delete it, `new` empty) only if it is still `expected`."""
    return replies.integer(await SWAP_IF_EQUAL.run(redis, [key], [expected, new])) == 1
