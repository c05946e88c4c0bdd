"""Tell the world a job changed: live events for SSE and `Prefer: wait` (Redis pub/sub, best
effort), and webhooks (the durable outbox).

A job's final change is announced by finalize.lua itself (its id on `names.FINAL_CHANNEL`, in the
same step), and its first start by acquire_lease.lua (a `status` event on its channel): what is left
here is progress, the `start` of a job whose start is also a webhook, and the outbox."""

import redis.asyncio as aioredis

from services.api.envelope import envelope
from services.api.events import EventHub
from services.api.webhooks.outbox import Outbox
from shared import names
from shared.jobstore import JobRecord
from shared.messages import Progress, ProgressEvent, StatusEvent


class Notifier:
    def __init__(self, redis: aioredis.Redis, outbox: Outbox, public_url: str,
                 hub: EventHub | None = None) -> None:
        self.redis = redis
        self.outbox = outbox
        self.public_url = public_url
        self.hub = hub

    async def publish(self, job_id: str, event: StatusEvent | ProgressEvent) -> None:
        await self.redis.publish(names.events_channel(job_id), event.encode())

    async def status(self, rec: JobRecord) -> None:
        data = envelope(rec, self.public_url).model_dump(mode="json")
        await self.publish(rec.id, StatusEvent(data=data))

    async def started(self, rec: JobRecord) -> None:
        await self.status(rec)
        await self.outbox.enqueue(rec, "start")

    async def progress(self, rec: JobRecord) -> None:
        await self.publish(rec.id, ProgressEvent(data=Progress(done=rec.done, total=rec.total)))
        await self.outbox.enqueue(rec, "progress")

    async def completed(self, rec: JobRecord) -> None:
        """The job became final here. finalize.lua has told every replica's listeners already;
        this replica's own waiters are also handed the record, so they need not read it."""
        if self.hub is not None:
            self.hub.finished_here(rec)
        await self.outbox.enqueue(rec, "completed")
