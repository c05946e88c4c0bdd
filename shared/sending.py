"""Sending sub-requests to their model's Celery queue: by the API at submit and by the janitor,
and by a draining worker handing work back."""

import asyncio

from celery import Celery

from shared.job import DEFAULT_PRIORITY, MAX_PRIORITY
from shared.messages import SubRequest
from shared.names import RUN_SUBREQUEST_TASK, queue_for


async def send_subrequests(
    celery: Celery, subs: list[SubRequest], priority: int = DEFAULT_PRIORITY
) -> None:
    """Enqueue on each model's queue; 0 is the highest priority, MAX_PRIORITY the lowest."""
    if not 0 <= priority <= MAX_PRIORITY:
        # kombu would clamp it silently into another priority list.
        raise ValueError(f"priority must be 0..{MAX_PRIORITY}, not {priority}")
    if subs:
        # kombu publishes synchronously; keep it off the event loop.
        await asyncio.to_thread(_send, celery, subs, priority)


def _send(celery: Celery, subs: list[SubRequest], priority: int) -> None:
    with celery.producer_or_acquire() as producer:
        for sub in subs:
            celery.send_task(
                RUN_SUBREQUEST_TASK,
                args=sub.task_args(),
                queue=queue_for(sub.model),
                producer=producer,
                priority=priority,
            )
