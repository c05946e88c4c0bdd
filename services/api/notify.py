"""Tell the world a job changed: live events for SSE and `Prefer: wait` (Redis pub/sub, best
effort), and webhooks (the durable outbox)."""

import redis.asyncio as aioredis

from services.api.envelope import envelope
from services.api.webhooks.outbox import Outbox
from shared import names
from shared.jobstore import JobRecord
from shared.messages import Progress, ProgressEvent, StatusEvent


class Notifier:
    def __init__(self, redis: aioredis.Redis, outbox: Outbox, base_url: str) -> None:
        self.redis = redis
        self.outbox = outbox
        self.base_url = base_url

    async def publish(self, job_id: str, event: StatusEvent | ProgressEvent) -> None:
        await self.redis.publish(names.events_channel(job_id), event.encode())

    async def status(self, rec: JobRecord) -> None:
        data = envelope(rec, self.base_url).model_dump(mode="json")
        await self.publish(rec.id, StatusEvent(data=data))

    async def started(self, rec: JobRecord) -> None:
        await self.status(rec)
        await self.outbox.enqueue(rec, "start")

    async def progress(self, rec: JobRecord) -> None:
        await self.publish(rec.id, ProgressEvent(data=Progress(done=rec.done, total=rec.total)))
        await self.outbox.enqueue(rec, "progress")

    async def completed(self, rec: JobRecord) -> None:
        await self.status(rec)
        await self.outbox.enqueue(rec, "completed")
