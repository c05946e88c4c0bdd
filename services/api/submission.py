"""Accept a job: check it, store it once, send its sub-requests."""

import secrets
import uuid
from dataclasses import dataclass

import redis.asyncio as aioredis

from services.api import idempotency, metrics
from services.api.auth import Principal
from services.api.backpressure import check_backpressure
from services.api.dispatch import Dispatcher
from services.api.webhooks.ssrf import check_webhook_url
from shared.errors import InvalidInput, JobNotFound
from shared.job import ImageJobRequest, JobMeta, JobOptions, JobStatus, TextJobRequest
from shared.jobstore import JobRecord, JobStore
from shared.registry import ModelRegistry
from shared.settings import Settings


@dataclass
class Submitted:
    job: JobRecord
    created: bool  # False when an Idempotency-Key gave back an earlier job


async def submit(
    req: TextJobRequest | ImageJobRequest,
    principal: Principal,
    idempotency_key: str | None,
    redis: aioredis.Redis,
    store: JobStore,
    registry: ModelRegistry,
    dispatcher: Dispatcher,
    settings: Settings,
) -> Submitted:
    spec = registry.get(req.model)
    if spec.task != req.task:
        raise InvalidInput("task", f"model {req.model} serves {spec.task}, not {req.task}")
    req.input.check_limits(spec)
    if req.deadline_seconds is not None and req.deadline_seconds > settings.max_deadline_seconds:
        raise InvalidInput("deadline_seconds",
                           f"at most {settings.max_deadline_seconds} seconds")
    if req.webhook is not None:
        await check_webhook_url(str(req.webhook), settings.webhook_allow_private)
    if idempotency_key is not None and len(idempotency_key) > idempotency.MAX_KEY_LENGTH:
        raise InvalidInput("Idempotency-Key",
                           f"longer than {idempotency.MAX_KEY_LENGTH} characters")
    digest = idempotency.body_digest(req.model_dump(mode="json"))  # before a seed is chosen
    if req.input.seed is None:
        # Stored with the job, so every job can be reproduced from its own record.
        req.input.seed = secrets.randbelow(2**31 - 1)
    job_id = uuid.uuid4().hex
    rec_input = req.input.model_dump(mode="json")
    # Split before storing, so a job that cannot be split is never accepted.
    probe = JobRecord(job_id, req.task, req.model, JobStatus.QUEUED, rec_input, 0, 0.0)
    subs = dispatcher.subrequests(probe)
    if idempotency_key is not None:
        earlier = await idempotency.claim(redis, principal.key_id, idempotency_key, digest,
                                          job_id)
        if earlier is not None:
            try:
                return Submitted(await store.get(earlier), created=False)
            except JobNotFound:  # the earlier job expired: the key is free again
                await idempotency.release(redis, principal.key_id, idempotency_key)
                return await submit(req, principal, idempotency_key, redis, store, registry,
                                    dispatcher, settings)
    try:
        # After the Idempotency-Key: replaying an accepted job must not get a 503.
        await check_backpressure(redis, spec, settings, len(subs))
    except Exception:
        if idempotency_key is not None:
            await idempotency.release(redis, principal.key_id, idempotency_key)
        raise
    meta = JobMeta(**req.model_dump(include=set(JobOptions.model_fields)),
                   owner=principal.key_id, idempotency_key=idempotency_key)
    try:
        rec = await store.create(job_id, req.task, req.model, rec_input, len(subs), meta)
    except Exception:
        if idempotency_key is not None:
            await idempotency.release(redis, principal.key_id, idempotency_key)
        raise
    # Counted once the job exists (it will reach a final status and be counted finished, even
    # if sending fails below): an Idempotency-Key replay above is not a new job.
    metrics.JOBS_SUBMITTED.labels(req.task, req.model).inc()
    # From here the job exists: if sending fails half-way, the janitor finishes dispatching.
    await dispatcher.send(subs, req.priority)
    await store.mark_dispatched(job_id)
    return Submitted(rec, created=True)
