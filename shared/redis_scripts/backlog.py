"""Wrappers of the scripts that take work to send again: outstanding sub-requests in a model's
backlog, and ids due in a time-scored zset (scripts/mark_sent.lua, claim_lost.lua,
claim_due.lua)."""

import redis.asyncio as aioredis

from shared import names
from shared import redis_replies as replies
from shared.redis_scripts.loader import Script

MARK_SENT = Script("mark_sent")
CLAIM_LOST = Script("claim_lost")
CLAIM_DUE = Script("claim_due")


async def mark_sent(redis: aioredis.Redis, *, model: str, members: list[str]) -> int:
    """These outstanding sub-requests count as sent now; how many scores changed."""
    return replies.integer(await MARK_SENT.run(redis, [names.backlog_key(model)], members))


async def claim_lost(redis: aioredis.Redis, *, model: str, member: str, sent: float) -> bool:
    """True when the sub-request was taken for sending again by this caller."""
    return replies.integer(await CLAIM_LOST.run(
        redis, [names.backlog_key(model), names.LEASES], [member, repr(sent)])) == 1


async def claim_due(redis: aioredis.Redis, *, key: str, age: float, retry_seconds: float,
                    limit: int) -> list[str]:
    """The ids in `key` at least `age` seconds due, each now due again `retry_seconds` later."""
    return replies.texts(await CLAIM_DUE.run(
        redis, [key], [repr(age), repr(retry_seconds), limit]))
