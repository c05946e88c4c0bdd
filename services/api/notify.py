"""Tell the world a job changed: live events for SSE and `Prefer: wait` (Redis pub/sub, best
effort), and webhooks (the durable outbox)."""

import json

import redis.asyncio as aioredis

from services.api.envelope import envelope
from services.api.webhooks.outbox import Outbox
from shared import names
from shared.jobstore import JobRecord


class Notifier:
    def __init__(self, redis: aioredis.Redis, outbox: Outbox, base_url: str) -> None:
        self.redis = redis
        self.outbox = outbox
        self.base_url = base_url

    async def publish(self, job_id: str, event: str, data: dict) -> None:
        await self.redis.publish(names.events_channel(job_id),
                                 json.dumps({"event": event, "data": data}))

    async def status(self, rec: JobRecord) -> None:
        await self.publish(rec.id, "status", envelope(rec, self.base_url).model_dump(mode="json"))

    async def started(self, rec: JobRecord) -> None:
        await self.status(rec)
        await self.outbox.enqueue(rec, "start")

    async def progress(self, rec: JobRecord) -> None:
        await self.publish(rec.id, "progress", {"done": rec.done, "total": rec.total})
        await self.outbox.enqueue(rec, "progress")

    async def completed(self, rec: JobRecord) -> None:
        await self.status(rec)
        await self.outbox.enqueue(rec, "completed")
