"""A batch's webhook (a Fibermill extension): when the batch ends, one signed POST (Standard
Webhooks headers, signed as job webhooks are: services/api/webhooks/) of an event
`{"id", "object": "event", "type": "batch.completed" | "batch.failed" | "batch.expired" |
"batch.cancelled", "created_at", "data": <the batch object>}`.

The batch stays in the driver's set until the event is delivered or given up, so a replica that
dies mid-delivery leaves it to the next. Retries back off exponentially with full jitter
(`webhook_backoff_base_seconds` .. `webhook_backoff_cap_seconds`), for at most
`webhook_retry_total_seconds` after the first attempt; every attempt has the same `webhook-id`."""

import contextlib
import logging
import random
import time

import redis.asyncio as aioredis

from services.api.batches.store import BatchStore, openai_batch
from services.api.webhooks.keyring import Keyring
from services.api.webhooks.sender import Sender
from shared.settings import Settings

log = logging.getLogger(__name__)

SETTLED = ("delivered", "given_up")


class BatchWebhooks:
    def __init__(self, redis: aioredis.Redis, batches: BatchStore, settings: Settings) -> None:
        self.redis = redis
        self.batches = batches
        self.settings = settings
        self._sender: Sender | None = None
        self.keyring = Keyring(redis, settings)  # signed with the batch owner's secrets

    async def sender(self) -> Sender:
        if self._sender is None:
            self._sender = Sender(self.settings.webhook_timeout_seconds,
                                  self.settings.webhook_allow_private)
        return self._sender

    async def aclose(self) -> None:
        if self._sender is not None:
            with contextlib.suppress(Exception):
                await self._sender.aclose()
            self._sender = None

    async def settle(self, h: dict[str, str]) -> bool:
        """Deliver the ended batch's event when it is due; True once it needs nothing more
        (delivered, given up, or no webhook)."""
        url = h.get("webhook")
        if not url or h.get("webhook_state") in SETTLED:
            return True
        now = time.time()
        if now < float(h.get("webhook_next_at") or 0):
            return False
        first = float(h.get("webhook_first_at") or now)
        attempts = int(h.get("webhook_attempts") or 0) + 1
        event_id = f"evt_{h['id'].removeprefix('batch_')}"
        payload = {"id": event_id, "object": "event", "type": f"batch.{h['status']}",
                   "created_at": int(now), "data": openai_batch(h)}
        signer = await self.keyring.signer(h.get("owner") or None)
        result = await (await self.sender()).post(url, event_id, payload, signer)
        fields: dict[str, object] = {"webhook_attempts": attempts, "webhook_first_at": first}
        if result.verdict == "delivered":
            fields["webhook_state"] = "delivered"
        else:
            delay = min(self.settings.webhook_backoff_cap_seconds,
                        self.settings.webhook_backoff_base_seconds * 2 ** (attempts - 1))
            delay = max(delay * random.random(), result.retry_after or 0)
            if result.verdict == "final" or \
                    now + delay - first > self.settings.webhook_retry_total_seconds:
                fields["webhook_state"] = "given_up"
                log.warning("batch %s: webhook given up after %d attempts: %s", h["id"],
                            attempts, result.error)
            else:
                fields["webhook_next_at"] = now + delay
        await self.batches.set_fields(h["id"], **fields)
        return fields.get("webhook_state") in SETTLED
