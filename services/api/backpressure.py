"""Refuse new work for a model whose queue is already long: better a quick 503 than a job
that waits for hours. Checked before a job is stored, so a refused job leaves nothing behind.

The check and the enqueue are separate steps, so replicas submitting at once can overshoot
the limit by what they add together; the limit is a guard against runaway queues, not a quota.
"""

from redis.asyncio import Redis

from shared.errors import InvalidInput, ServiceUnavailable
from shared.queue_depth import queue_depth
from shared.registry import ModelSpec
from shared.settings import Settings

RETRY_AFTER_SECONDS = 5


async def check_backpressure(
    redis: Redis, spec: ModelSpec, settings: Settings, incoming: int
) -> None:
    """Raise ServiceUnavailable if `incoming` more sub-requests would overfill the queue, or
    InvalidInput for a job that could never fit, however empty the queue."""
    limit = spec.max_queue_depth or settings.max_queue_depth
    if incoming > limit:
        raise InvalidInput("input.prompts",
                           f"{incoming} sub-requests in one job; model {spec.name} queues at "
                           f"most {limit}")
    depth = await queue_depth(redis, spec.name)
    if depth + incoming > limit:
        raise ServiceUnavailable(
            f"model {spec.name} is overloaded: {depth} sub-requests queued, this job adds "
            f"{incoming}, the limit is {limit}; retry later",
            retry_after=RETRY_AFTER_SECONDS,
        )
