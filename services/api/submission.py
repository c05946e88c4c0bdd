"""Accept a job: check it, then store it and send its sub-requests in one step."""

import secrets
import uuid
from dataclasses import dataclass

import redis.asyncio as aioredis

from services.api import idempotency, metrics
from services.api.auth import Principal
from services.api.backpressure import QueueDepths
from services.api.dispatch import Dispatcher
from services.api.webhooks.ssrf import check_webhook_url
from shared.errors import InvalidInput
from shared.job import JobMeta, JobOptions, JobRequest, JobStatus
from shared.jobstore import Enqueue, JobRecord, JobStore
from shared.registry import ModelRegistry, ModelSpec
from shared.settings import Settings


@dataclass
class Submitted:
    job: JobRecord
    created: bool  # False when an Idempotency-Key gave back an earlier job


class Submissions:
    """Job submission, built once per app with what every submission needs."""

    def __init__(
        self,
        redis: aioredis.Redis,
        store: JobStore,
        registry: ModelRegistry,
        dispatcher: Dispatcher,
        settings: Settings,
    ) -> None:
        self.redis = redis
        self.store = store
        self.registry = registry
        self.dispatcher = dispatcher
        self.settings = settings
        self.claims = idempotency.Claims(redis)
        self.depths = QueueDepths(redis, settings)

    async def submit(
        self, req: JobRequest, principal: Principal, idempotency_key: str | None
    ) -> Submitted:
        spec = await self._validate(req, idempotency_key)
        # Of the body as sent, before a seed is chosen; only an Idempotency-Key needs it.
        digest = (idempotency.body_digest(req.model_dump(mode="json"))
                  if idempotency_key is not None else "")
        _choose_seed(req)
        probe = _probe(req)
        # Split before storing, so a job that cannot be split is never accepted.
        subs = self.dispatcher.subrequests(probe)
        async with self.claims.hold(
            principal.key_id, idempotency_key, digest, probe.id, self.store.get
        ) as earlier:
            if earlier is not None:
                return Submitted(earlier, created=False)
            # After the Idempotency-Key: replaying an accepted job must not get a 503.
            await self.depths.check(spec, len(subs))
            # Stored and sent in one step: a job is never left half-sent.
            enqueue = self.dispatcher.messages(subs, req.priority) if subs else None
            rec = await self._create(req, probe, len(subs), principal, idempotency_key,
                                     enqueue)
        # Counted once the job exists (it will reach a final status and be counted finished):
        # an Idempotency-Key replay is not a new job.
        metrics.JOBS_SUBMITTED.labels(req.task, req.model).inc()
        self.depths.added(spec.name, len(subs))
        if enqueue is None:
            await self.store.mark_dispatched(rec.id)  # nothing to send
        return Submitted(rec, created=True)

    async def _validate(self, req: JobRequest, idempotency_key: str | None) -> ModelSpec:
        """The model's spec, once the request fits its model and the server's limits."""
        spec = self.registry.get(req.model)
        if spec.task != req.task:
            raise InvalidInput("task", f"model {req.model} serves {spec.task}, not {req.task}")
        req.input.check_limits(spec)
        limit = self.settings.max_deadline_seconds
        if req.deadline_seconds is not None and req.deadline_seconds > limit:
            raise InvalidInput("deadline_seconds", f"at most {limit} seconds")
        if req.webhook is not None:
            await check_webhook_url(str(req.webhook), self.settings.webhook_allow_private)
        if idempotency_key is not None and len(idempotency_key) > idempotency.MAX_KEY_LENGTH:
            raise InvalidInput("Idempotency-Key",
                               f"longer than {idempotency.MAX_KEY_LENGTH} characters")
        return spec

    async def _create(
        self,
        req: JobRequest,
        probe: JobRecord,
        total: int,
        principal: Principal,
        idempotency_key: str | None,
        enqueue: Enqueue | None,
    ) -> JobRecord:
        meta = JobMeta(**req.model_dump(include=set(JobOptions.model_fields)),
                       owner=principal.key_id, idempotency_key=idempotency_key)
        return await self.store.create(probe.id, probe.task, probe.model, probe.input, total,
                                       meta, enqueue)


def _choose_seed(req: JobRequest) -> None:
    if req.input.seed is None:
        # Stored with the job, so every job can be reproduced from its own record.
        req.input.seed = secrets.randbelow(2**31 - 1)


def _probe(req: JobRequest) -> JobRecord:
    """The record the job will have, under a new id, for splitting it before it is stored."""
    rec_input = req.input.model_dump(mode="json")
    return JobRecord(uuid.uuid4().hex, req.task, req.model, JobStatus.QUEUED, rec_input, 0, 0.0)
