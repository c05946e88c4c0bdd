"""Wrappers of the per-key quota scripts (scripts/quota_*.lua): a key's batch work reserved in
its share of a model's queue, and the lock one request of a key holds while it counts a quota
and acts on it."""

import redis.asyncio as aioredis

from shared import names
from shared import redis_replies as replies
from shared.redis_scripts.loader import Script

QUOTA_RESERVE = Script("quota_reserve")
QUOTA_RELEASE = Script("quota_release")
QUOTA_UNLOCK = Script("quota_unlock")


def work_member(job_id: str, subrequests: int) -> str:
    return f"{subrequests}:{job_id}"


async def reserve(redis: aioredis.Redis, *, owner: str | None, model: str, member: str,
                  subrequests: int, limit: int, now_ms: int, keep_seconds: int) -> int:
    """-1 when `member` is reserved, else the sub-requests the key has outstanding (the
    reservation would pass `limit`)."""
    return replies.integer(await QUOTA_RESERVE.run(
        redis, [names.batch_work_key(owner, model), names.batch_work_total_key(owner, model)],
        [member, subrequests, limit, now_ms, keep_seconds]))


async def release(redis: aioredis.Redis, *, owner: str | None, model: str,
                  members: list[str]) -> int:
    """Give the reservations `members` back: the sub-requests freed."""
    if not members:
        return 0
    return replies.integer(await QUOTA_RELEASE.run(
        redis, [names.batch_work_key(owner, model), names.batch_work_total_key(owner, model)],
        members))


async def unlock(redis: aioredis.Redis, *, key: str, token: str) -> bool:
    """True when `token` held the lock `key` (it is given up)."""
    return replies.integer(await QUOTA_UNLOCK.run(redis, [key], [token])) == 1
