"""The webhook outbox: pending deliveries live in Redis, so they survive API restarts, and
every API replica runs a sender loop that claims due ones.

A delivery is a hash (job, event, attempt, first enqueue time) plus a member of a due-time
ZSET. Claiming one atomically moves its due time forward by a lease and bumps its attempt
number, so exactly one replica sends each attempt, and a replica that dies mid-send only
delays it by the lease. The attempt number doubles as the claim token: a sender whose lease ran
out cannot overwrite what the next claimant decided.

`completed` deliveries are retried with backoff for `webhook_retry_total_seconds`; `start` and
`progress` are best effort (throttled, one retry) and have their own due queue and their own
sending slots, so they never hold up a `completed` one. An update that finds its job already
final when it is sent is dropped when a `completed` webhook for the job is coming anyway.

The delivered/failed hash is kept (as a tombstone) as long as the job, so a second enqueue of
the same event, e.g. from another replica, does not send it again.

Each attempt is signed with the secrets its job's owner has at the time (keyring.py): after a
rotation, a retry carries the new secret's signature beside the old one's.
"""

import asyncio
import contextlib
import functools
import logging
import ssl
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Literal, get_args

import redis.asyncio as aioredis
from opentelemetry.trace import StatusCode

from services.api.envelope import envelope
from services.api.webhooks.keyring import Keyring
from services.api.webhooks.metrics import DELIVERIES
from services.api.webhooks.retry import backoff
from services.api.webhooks.sender import Attempt, Sender
from shared import redis_replies, tracing
from shared.asyncio_compat import raise_if_cancelled
from shared.errors import JobNotFound
from shared.job import WebhookDelivery, WebhookEvent
from shared.jobstore import JobRecord, JobStore
from shared.names import (
    WEBHOOKS_DUE_COMPLETED,
    WEBHOOKS_DUE_UPDATES,
    webhook_throttle_key,
)
from shared.redis_scripts import webhooks as scripts
from shared.settings import Settings

log = logging.getLogger(__name__)

BEST_EFFORT_ATTEMPTS = 2
BEST_EFFORT_RETRY_SECONDS = 1.0
BEST_EFFORT_MAX_DELAY_SECONDS = 10.0  # a later update is worth less than none
BEST_EFFORT_TTL_SECONDS = 3600
LEASE_MARGIN_SECONDS = 30.0  # beyond the bounded send: reading the job, recording the attempt

Outcome = Literal["delivered", "failed", "dropped"]


def webhook_id(job_id: str, event: WebhookEvent, seq: int | None = None) -> str:
    """The `webhook-id` header: the same for every attempt, and for every replica."""
    return f"msg_{job_id}_{event}" if seq is None else f"msg_{job_id}_{event}_{seq}"


def due_key(event: WebhookEvent) -> str:
    return WEBHOOKS_DUE_COMPLETED if event == "completed" else WEBHOOKS_DUE_UPDATES


@dataclass(frozen=True)
class Claim:
    id: str
    job_id: str
    event: WebhookEvent
    attempt: int
    first_at: float

    @property
    def best_effort(self) -> bool:
        return self.event != "completed"

    @property
    def delivery(self) -> scripts.Delivery:
        return scripts.Delivery(self.id, due_key(self.event))


def _event(name: str) -> WebhookEvent:
    """The webhook event a delivery's hash names (one the outbox enqueued)."""
    for event in get_args(WebhookEvent):
        if event == name:
            return event
    raise ValueError(f"not a webhook event: {name!r}")


class Outbox:
    def __init__(
        self,
        redis: aioredis.Redis,
        store: JobStore,
        settings: Settings,
        consumer: str,
        *,
        poll_interval: float = 0.1,
        max_in_flight: int = 64,
        max_updates_in_flight: int = 16,
        verify: ssl.SSLContext | bool = True,
    ) -> None:
        self.redis = redis
        self.store = store
        self.settings = settings
        self.consumer = consumer
        self.poll_interval = poll_interval
        self.limits = {
            WEBHOOKS_DUE_COMPLETED: max_in_flight,
            WEBHOOKS_DUE_UPDATES: max_updates_in_flight,
        }
        self.verify = verify
        self.keyring = Keyring(redis, settings)
        self.lease_seconds = settings.webhook_timeout_seconds + LEASE_MARGIN_SECONDS
        # A completed delivery's tombstone lives as long as its job, and at least until the
        # last retry could have been claimed.
        self.completed_ttl = int(max(
            store.finished_ttl,
            settings.webhook_retry_total_seconds + 2 * self.lease_seconds,
        ))
        self._wake = asyncio.Event()
        self._busy: dict[str, set[asyncio.Task[None]]] = {
            WEBHOOKS_DUE_COMPLETED: set(),
            WEBHOOKS_DUE_UPDATES: set(),
        }

    # Enqueue -------------------------------------------------------------------------------

    async def enqueue(self, rec: JobRecord, event: WebhookEvent) -> None:
        """Record a delivery of `event` for the job, if its webhook filter wants it."""
        if not rec.meta.wants(event):
            return
        if event == "progress":
            interval_ms = int(self.settings.webhook_progress_interval_seconds * 1000)
            # One progress webhook per job per interval, across all replicas.
            if interval_ms > 0 and not await self.redis.set(
                webhook_throttle_key(rec.id), 1, nx=True, px=interval_ms
            ):
                return
            wid, ttl = webhook_id(rec.id, event, rec.done), BEST_EFFORT_TTL_SECONDS
        elif event == "start":
            wid, ttl = webhook_id(rec.id, event), BEST_EFFORT_TTL_SECONDS
        else:
            wid, ttl = webhook_id(rec.id, event), self.completed_ttl
        delivery = scripts.Delivery(wid, due_key(event))
        added = await scripts.enqueue(self.redis, delivery=delivery, job_id=rec.id, event=event,
                                      now=time.time(), ttl=ttl)
        if added:
            self._wake.set()

    # Sender loop ---------------------------------------------------------------------------

    async def run(self) -> None:
        sender = Sender(
            self.settings.webhook_timeout_seconds,
            self.settings.webhook_allow_private,
            self.verify,
        )
        try:
            while True:
                raise_if_cancelled()
                try:
                    for queue in (WEBHOOKS_DUE_COMPLETED, WEBHOOKS_DUE_UPDATES):
                        await self._dispatch(queue, sender)
                except asyncio.CancelledError:
                    raise
                except Exception:
                    log.exception("webhook outbox loop error")
                    await asyncio.sleep(1)
                await self._nap()
        finally:
            tasks = [t for busy in self._busy.values() for t in busy]
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            await sender.aclose()

    async def _nap(self) -> None:
        """Until an enqueue or a finished send in this replica, or the next poll, whichever
        comes first: other replicas' enqueues are seen by polling."""
        if not self._wake.is_set():
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self.poll_interval):
                    await self._wake.wait()
        self._wake.clear()

    async def _dispatch(self, queue: str, sender: Sender) -> None:
        busy = self._busy[queue]
        free = self.limits[queue] - len(busy)
        if free <= 0:
            return
        for claim in await self._claim(queue, free):
            task = asyncio.create_task(self._deliver(claim, sender), name=f"webhook {claim.id}")
            busy.add(task)
            task.add_done_callback(functools.partial(self._finished, busy))

    def _finished(self, busy: set[asyncio.Task[None]], task: asyncio.Task[None]) -> None:
        busy.discard(task)
        self._wake.set()  # a slot is free: there may be more due

    async def _claim(self, queue: str, limit: int) -> list[Claim]:
        now = time.time()
        ids = await self.redis.zrangebyscore(queue, "-inf", now, start=0, num=limit)
        claims = []
        for wid in redis_replies.texts(ids):
            # Another replica may take it between the range and here: TAKE re-checks the due
            # time, so only one of them gets it.
            taken = await scripts.take(self.redis, delivery=scripts.Delivery(wid, queue),
                                       now=now, lease_until=now + self.lease_seconds,
                                       consumer=self.consumer)
            if taken is not None:
                claims.append(Claim(wid, taken.job_id, _event(taken.event), taken.attempt,
                                    taken.first_at))
        return claims

    async def _deliver(self, claim: Claim, sender: Sender) -> None:
        recorded: list[bool] = []  # set once this attempt is on the job's record
        try:
            await self._attempt(claim, sender, recorded)
        except asyncio.CancelledError:
            # Shutting down: hand the claim back rather than leave it for the lease to expire;
            # an attempt already on record keeps its number (the next one is due now).
            with contextlib.suppress(Exception):
                if recorded:
                    await scripts.settle(self.redis, delivery=claim.delivery,
                                         attempt=claim.attempt, next_at=time.time())
                else:
                    await scripts.release(self.redis, delivery=claim.delivery,
                                          attempt=claim.attempt, now=time.time())
            raise
        except Exception:
            # Left claimed: the lease runs out and a replica tries again.
            log.exception("webhook %s attempt %d failed", claim.id, claim.attempt)

    async def _attempt(self, claim: Claim, sender: Sender, recorded: list[bool]) -> None:
        try:
            rec = await self.store.get(claim.job_id)
        except JobNotFound:
            await self._end(claim, "dropped")
            return
        if rec.meta.webhook is None or (
            # The completed webhook that is coming carries everything an update would.
            claim.best_effort and rec.final and rec.meta.wants("completed")
        ):
            await self._end(claim, "dropped")
            return
        raise_if_cancelled()  # not a new request from a replica that is stopping
        payload = envelope(rec, self.settings.public_url).model_dump(mode="json")
        signer = await self.keyring.signer(rec.meta.owner)
        at = datetime.now(UTC)
        attempt = tracing.start("fibermill.webhook", rec.meta.traceparent, attributes={
            "fibermill.job_id": rec.id, "fibermill.webhook.event": claim.event,
            "fibermill.webhook.attempt": claim.attempt})
        result = await sender.post(str(rec.meta.webhook), claim.id, payload, signer)
        if attempt is not None:
            if result.verdict != "delivered":
                attempt.set_status(StatusCode.ERROR, result.error or result.verdict)
            tracing.end(attempt, attributes={"fibermill.webhook.verdict": result.verdict,
                                             "http.response.status_code": result.status_code
                                             or 0})
        record = asyncio.ensure_future(self.store.record_delivery(claim.job_id, WebhookDelivery(
            webhook_id=claim.id, event=claim.event, attempt=claim.attempt,
            status_code=result.status_code, error=result.error, at=at,
        )))
        try:
            await asyncio.shield(record)
        finally:
            # Whether or not this task is being cancelled, the record is written or failed
            # before anyone decides what this attempt's number means.
            with contextlib.suppress(BaseException):
                await asyncio.wait([record])
            if record.done() and not record.cancelled() and record.exception() is None:
                recorded.append(True)
        if result.verdict == "delivered":
            await self._end(claim, "delivered")
            return
        next_at = self._next_attempt(claim, result) if result.verdict == "retry" else None
        if next_at is None:
            await self._end(claim, "failed")
        elif await scripts.settle(self.redis, delivery=claim.delivery, attempt=claim.attempt,
                                  next_at=next_at):
            DELIVERIES.labels(outcome="retrying").inc()

    def _next_attempt(self, claim: Claim, result: Attempt) -> float | None:
        """When to try again, or None when this delivery has had its chances."""
        now, asked = time.time(), result.retry_after
        if claim.best_effort:
            delay = BEST_EFFORT_RETRY_SECONDS if asked is None else asked
            if claim.attempt >= BEST_EFFORT_ATTEMPTS or delay > BEST_EFFORT_MAX_DELAY_SECONDS:
                return None
            return now + delay
        if asked is None:
            delay = backoff(claim.attempt, self.settings.webhook_backoff_base_seconds,
                            self.settings.webhook_backoff_cap_seconds)
        else:
            delay = asked
        if now + delay > claim.first_at + self.settings.webhook_retry_total_seconds:
            return None
        return now + delay

    async def _end(self, claim: Claim, outcome: Outcome) -> None:
        if await scripts.settle(self.redis, delivery=claim.delivery, attempt=claim.attempt,
                                next_at=None, state=outcome):
            DELIVERIES.labels(outcome=outcome).inc()
