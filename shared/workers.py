"""Worker heartbeats: each worker process announces itself and the models it serves."""

import redis.asyncio as aioredis
from pydantic import BaseModel

from shared import names


class WorkerInfo(BaseModel):
    id: str
    name: str
    host: str
    pid: int
    device: str
    models: list[str]
    in_flight: int = 0
    started_at: float
    seen_at: float


async def announce(redis: aioredis.Redis, info: WorkerInfo, ttl_seconds: float) -> None:
    await redis.set(names.worker_key(info.id), info.model_dump_json(), px=int(ttl_seconds * 1000))


async def withdraw(redis: aioredis.Redis, worker_id: str) -> None:
    await redis.delete(names.worker_key(worker_id))


async def live_workers(redis: aioredis.Redis) -> list[WorkerInfo]:
    keys = [k async for k in redis.scan_iter(match=f"{names.WORKER_PREFIX}*", count=500)]
    if not keys:
        return []
    raw = await redis.mget(keys)
    return sorted((WorkerInfo.model_validate_json(v) for v in raw if v), key=lambda w: w.id)
