"""Per-step progress of a running sub-request, published for the job's live event stream.

Pipelines call their `should_stop` hook once between denoise or decode steps; that boundary is
also where progress is counted, so this hook does both. Publishing is fire-and-forget and
throttled to one event per `MIN_INTERVAL_SECONDS` (the first at the first step, so that even a
short sub-request shows it started): a slow Redis never slows the device thread.
"""

import asyncio
import time

import redis.asyncio as aioredis

from services.worker.engine.batch import ShouldStop
from services.worker.flights import InFlight
from shared import names
from shared.messages import ImageItem, StepData, StepEvent

MIN_INTERVAL_SECONDS = 0.1


class ProgressPublisher:
    def __init__(self, redis: aioredis.Redis, loop: asyncio.AbstractEventLoop) -> None:
        self.redis = redis
        self.loop = loop  # the runtime's loop; hooks are called from the device thread

    def hook(self, flight: InFlight) -> ShouldStop:
        sub = flight.sub
        total = sub.item.steps if isinstance(sub.item, ImageItem) else sub.item.max_new_tokens
        channel = names.events_channel(sub.job_id)
        last_sent = 0.0

        def should_stop() -> bool:
            nonlocal last_sent
            flight.steps += 1
            now = time.monotonic()
            if now - last_sent >= MIN_INTERVAL_SECONDS:
                last_sent = now
                event = StepEvent(data=StepData(index=sub.index, step=min(flight.steps, total),
                                                steps=total))
                asyncio.run_coroutine_threadsafe(self.redis.publish(channel, event.encode()),
                                                 self.loop)
            return flight.stop.is_set()

        return should_stop
