"""How many sub-requests wait in a model's queue, over all of its priority lists."""

from redis.asyncio import Redis

from shared.celery_config import PRIORITY_SEP, PRIORITY_STEPS
from shared.names import queue_for


def priority_lists(model: str) -> list[str]:
    """The Redis lists kombu keeps for the model's queue, highest priority first."""
    queue = queue_for(model)
    return [f"{queue}{PRIORITY_SEP}{p}" if p else queue for p in PRIORITY_STEPS]


async def queue_depth(redis: Redis, model: str) -> int:
    async with redis.pipeline(transaction=False) as pipe:
        for key in priority_lists(model):
            pipe.llen(key)
        return sum(await pipe.execute())
