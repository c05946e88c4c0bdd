"""How many sub-requests wait in a model's queue: its interactive lists (what backpressure
counts) and its batch list, apart."""

from redis.asyncio import Redis

from shared.celery_config import PRIORITY_SEP, PRIORITY_STEPS
from shared.job import BATCH_PRIORITY
from shared.names import queue_for


def priority_lists(model: str) -> list[str]:
    """The Redis lists kombu keeps for the model's queue, highest priority first (the batch
    list last)."""
    queue = queue_for(model)
    return [f"{queue}{PRIORITY_SEP}{p}" if p else queue for p in PRIORITY_STEPS]


def batch_list(model: str) -> str:
    return priority_lists(model)[BATCH_PRIORITY]


async def queue_depth(redis: Redis, model: str) -> int:
    """Interactive sub-requests waiting: every priority list but the batch list."""
    async with redis.pipeline(transaction=False) as pipe:
        for key in priority_lists(model)[:BATCH_PRIORITY]:
            pipe.llen(key)
        return sum(await pipe.execute())


async def batch_depth(redis: Redis, model: str) -> int:
    """Batch lines' sub-requests waiting."""
    return int(await redis.llen(batch_list(model)))
