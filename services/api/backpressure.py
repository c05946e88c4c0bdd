"""Refuse new work for a model whose queue is already long: better a quick 503 than a job
that waits for hours. Checked before a job is stored, so a refused job leaves nothing behind.

The check and the enqueue are separate steps, so replicas submitting at once can overshoot
the limit by what they add together; the limit is a guard against runaway queues, not a quota.
That is also why `QueueDepths` may answer from a depth read up to `FRESH_SECONDS` ago (plus
what this replica added since) while the queue is far from its limit: reading every priority
list on every submission would cost more than the rest of the submission. Near the limit, and
before any refusal, the depth is read again. Submissions that need a read while one is under
way share it: when the last read went stale, every submission arriving in the next round trip
(32 at once in the benchmarks) would otherwise read the same lists again.
"""

import asyncio
import time

from redis.asyncio import Redis

from shared.errors import InvalidInput, ServiceUnavailable
from shared.queue_depth import queue_depth
from shared.registry import ModelSpec
from shared.settings import Settings

RETRY_AFTER_SECONDS = 5
FRESH_SECONDS = 1.0  # how old a depth read may be while the queue is under half its limit


def _limit(spec: ModelSpec, settings: Settings, incoming: int) -> int:
    limit = spec.max_queue_depth or settings.max_queue_depth
    if incoming > limit:
        raise InvalidInput("input.prompts",
                           f"{incoming} sub-requests in one job; model {spec.name} queues at "
                           f"most {limit}")
    return limit


def _refuse(spec: ModelSpec, depth: int, incoming: int, limit: int) -> ServiceUnavailable:
    return ServiceUnavailable(
        f"model {spec.name} is overloaded: {depth} sub-requests queued, this job adds "
        f"{incoming}, the limit is {limit}; retry later",
        retry_after=RETRY_AFTER_SECONDS,
    )


async def check_backpressure(
    redis: Redis, spec: ModelSpec, settings: Settings, incoming: int
) -> None:
    """Raise ServiceUnavailable if `incoming` more sub-requests would overfill the queue, or
    InvalidInput for a job that could never fit, however empty the queue."""
    limit = _limit(spec, settings, incoming)
    depth = await queue_depth(redis, spec.name)
    if depth + incoming > limit:
        raise _refuse(spec, depth, incoming, limit)


class QueueDepths:
    """`check_backpressure` for one API process, reading each model's queue at most once per
    `FRESH_SECONDS` while it is under half its limit."""

    def __init__(self, redis: Redis, settings: Settings) -> None:
        self.redis = redis
        self.settings = settings
        self._seen: dict[str, tuple[int, float]] = {}  # model -> (depth, monotonic time read)
        self._reading: dict[str, asyncio.Task[int]] = {}  # model -> the read under way

    async def check(self, spec: ModelSpec, incoming: int) -> None:
        limit = _limit(spec, self.settings, incoming)
        seen = self._seen.get(spec.name)
        now = time.monotonic()
        if (seen is not None and now - seen[1] < FRESH_SECONDS
                and 2 * (seen[0] + incoming) <= limit):
            return
        depth = await self._read(spec.name)
        self._seen[spec.name] = (depth, now)
        if depth + incoming > limit:
            raise _refuse(spec, depth, incoming, limit)

    async def _read(self, model: str) -> int:
        task = self._reading.get(model)
        if task is None:
            task = asyncio.ensure_future(queue_depth(self.redis, model))
            self._reading[model] = task
            task.add_done_callback(lambda t: self._read_done(model, t))
        # Shielded: a submission that goes away does not cancel the others' read.
        return await asyncio.shield(task)

    def _read_done(self, model: str, task: asyncio.Task[int]) -> None:
        del self._reading[model]  # a new read starts only when none is under way
        if not task.cancelled():
            task.exception()  # retrieved here too, in case every waiter went away

    def added(self, model: str, n: int) -> None:
        """This replica queued `n` more sub-requests of `model`."""
        seen = self._seen.get(model)
        if seen is not None:
            self._seen[model] = (seen[0] + n, seen[1])
