"""Split a job into sub-requests and send each to its model's Celery queue by task name."""

import asyncio
import time

from celery import Celery

from shared.inputs import ImageGenerationInput, TextGenerationInput
from shared.job import DEFAULT_PRIORITY, MAX_PRIORITY
from shared.jobstore import JobRecord
from shared.names import RUN_SUBREQUEST_TASK, queue_for
from shared.registry import ModelRegistry
from shared.subrequest import SubRequest, split_items


class Dispatcher:
    def __init__(self, celery: Celery, registry: ModelRegistry) -> None:
        self.celery = celery
        self.registry = registry

    def subrequests(self, job: JobRecord) -> list[SubRequest]:
        """The job's sub-requests, rebuilt from its stored input (the same every time)."""
        spec = self.registry.get(job.model)
        cls = TextGenerationInput if job.task == "text-generation" else ImageGenerationInput
        inp = cls.model_validate(job.input)
        items = split_items(spec, inp, seed=inp.seed or 0)
        return [
            SubRequest(job_id=job.id, index=i, model=job.model, item=item)
            for i, item in enumerate(items)
        ]

    async def send(self, subs: list[SubRequest], priority: int = DEFAULT_PRIORITY) -> None:
        """Enqueue on the model's queue; 0 is the highest priority, MAX_PRIORITY the lowest."""
        if not 0 <= priority <= MAX_PRIORITY:
            # kombu would clamp it silently into another priority list.
            raise ValueError(f"priority must be 0..{MAX_PRIORITY}, not {priority}")
        if subs:
            # kombu publishes synchronously; keep it off the event loop.
            await asyncio.to_thread(self._send, subs, priority)

    def _send(self, subs: list[SubRequest], priority: int) -> None:
        with self.celery.producer_or_acquire() as producer:
            for sub in subs:
                sub.sent_at = time.time()
                self.celery.send_task(
                    RUN_SUBREQUEST_TASK,
                    args=[sub.model_dump(mode="json")],
                    queue=queue_for(sub.model),
                    producer=producer,
                    priority=priority,
                )
