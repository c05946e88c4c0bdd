"""A job's live events, for the SSE stream and for `Prefer: wait`.

Events are published on a per-job Redis channel (best effort). The job store stays the truth:
on every message, and every second without one, the record is read again, so a missed message
only delays an event and a client that connects late gets the current state first.
"""

import time
from collections.abc import AsyncIterator, Callable

import redis.asyncio as aioredis

from services.api.envelope import envelope
from shared import names
from shared.jobstore import JobRecord, JobStore
from shared.messages import StepEvent, decode_event

POLL_SECONDS = 1.0


async def job_events(
    redis: aioredis.Redis,
    store: JobStore,
    job_id: str,
    base_url: str,
    stop: Callable[[], bool] = lambda: False,
) -> AsyncIterator[tuple[str, dict]]:
    """Yield (event, data) pairs: `status` (the whole job) on every status change, `progress`
    when sub-requests finish, `step` for denoise/decode steps, until the job is final or
    `stop()` (checked at least once a second) says this replica is draining."""
    pubsub = redis.pubsub()
    await pubsub.subscribe(names.events_channel(job_id))  # before reading: nothing slips by
    try:
        rec = await store.get(job_id)
        yield "status", _status(rec, base_url)
        status, done = rec.status, rec.done
        while not rec.final and not stop():
            msg = await pubsub.get_message(ignore_subscribe_messages=True, timeout=POLL_SECONDS)
            if msg is not None:
                event = decode_event(msg["data"])
                if isinstance(event, StepEvent):
                    yield event.event, event.data.model_dump()
                    continue
            rec = await store.get(job_id)
            if rec.done > done:
                done = rec.done
                yield "progress", {"done": rec.done, "total": rec.total}
            if rec.status != status:
                status = rec.status
                yield "status", _status(rec, base_url)
    finally:
        await pubsub.aclose()


async def wait_final(
    redis: aioredis.Redis, store: JobStore, job_id: str, timeout: float
) -> JobRecord:
    """The job once it is final, or as it is after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    pubsub = redis.pubsub()
    await pubsub.subscribe(names.events_channel(job_id))
    try:
        rec = await store.get(job_id)
        while not rec.final and (left := deadline - time.monotonic()) > 0:
            await pubsub.get_message(ignore_subscribe_messages=True,
                                     timeout=min(left, POLL_SECONDS))
            rec = await store.get(job_id)
        return rec
    finally:
        await pubsub.aclose()


def _status(rec: JobRecord, base_url: str) -> dict:
    return envelope(rec, base_url).model_dump(mode="json")
