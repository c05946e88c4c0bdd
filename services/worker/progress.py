"""Per-step progress of a running sub-request, published for the job's live event stream.

Pipelines call their `should_stop` hook once between denoise or decode steps; that boundary is
also where progress is counted, so this hook does both. Publishing is fire-and-forget and
throttled: a slow Redis never slows the device thread.
"""

import asyncio
import json
import time

from services.worker.pipelines.base import ShouldStop
from services.worker.runtime import InFlight, WorkerRuntime
from shared import names
from shared.subrequest import ImageItem

MIN_INTERVAL_SECONDS = 0.1


def step_hook(rt: WorkerRuntime, flight: InFlight) -> ShouldStop:
    sub = flight.sub
    total = sub.item.steps if isinstance(sub.item, ImageItem) else sub.item.max_new_tokens
    channel = names.events_channel(sub.job_id)
    state = {"sent": 0.0}

    def should_stop() -> bool:
        flight.steps += 1
        now = time.monotonic()
        if now - state["sent"] >= MIN_INTERVAL_SECONDS:
            state["sent"] = now
            event = {"event": "step",
                     "data": {"index": sub.index, "step": min(flight.steps, total),
                              "steps": total}}
            asyncio.run_coroutine_threadsafe(rt.redis.publish(channel, json.dumps(event)),
                                             rt.loop)
        return flight.stop.is_set()

    return should_stop
