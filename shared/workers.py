"""Worker heartbeats in Redis: each worker process announces itself and the models it serves
under a key that expires unless renewed."""

import redis.asyncio as aioredis

from shared import names
from shared.messages import WorkerHeartbeat


async def announce(redis: aioredis.Redis, info: WorkerHeartbeat, ttl_seconds: float) -> None:
    await redis.set(names.worker_key(info.id), info.encode(), px=int(ttl_seconds * 1000))


async def withdraw(redis: aioredis.Redis, worker_id: str) -> None:
    await redis.delete(names.worker_key(worker_id))


async def live_workers(redis: aioredis.Redis) -> list[WorkerHeartbeat]:
    keys = [k async for k in redis.scan_iter(match=f"{names.WORKER_PREFIX}*", count=500)]
    if not keys:
        return []
    raw = await redis.mget(keys)
    return sorted((WorkerHeartbeat.decode(v) for v in raw if v), key=lambda w: w.id)
