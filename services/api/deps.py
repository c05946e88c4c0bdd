"""Dependency aliases the routes use, so each route stays a few lines.

Every dependency here is `async def`: FastAPI runs a plain `def` dependency in its thread pool,
a thread hand-off per dependency per request for what is an attribute read."""

import re
import time
from dataclasses import dataclass
from typing import Annotated

import redis.asyncio as aioredis
from fastapi import Depends, Header, Request

from services.api.auth import Principal, PrincipalDep, current_settings
from services.api.dispatch import Dispatcher
from services.api.events import EventHub
from services.api.lifecycle import Lifecycle
from services.api.prefer import PreferWait, prefer_wait
from services.api.ratelimit import RateLimiter, bucket_key
from services.api.submission import Submissions, Submitted
from services.api.watchers import Watchers
from shared import tracing
from shared.blobstore.base import BlobStore
from shared.errors import JobNotFound
from shared.job import JobRequest
from shared.jobstore import JobRecord, JobStore
from shared.registry import ModelRegistry
from shared.retention import missing_job
from shared.settings import Settings

SettingsDep = Annotated[Settings, Depends(current_settings)]


async def _store(request: Request) -> JobStore:
    return request.app.state.store


async def _blobs(request: Request) -> BlobStore:
    return request.app.state.blobs


async def _registry(request: Request) -> ModelRegistry:
    return request.app.state.registry


async def _dispatcher(request: Request) -> Dispatcher:
    return request.app.state.dispatcher


async def _redis(request: Request) -> aioredis.Redis:
    return request.app.state.redis


async def _lifecycle(request: Request) -> Lifecycle:
    return request.app.state.lifecycle


async def _limiter(request: Request) -> RateLimiter:
    return request.app.state.limiter


async def _submissions(request: Request) -> Submissions:
    return request.app.state.submissions


async def _hub(request: Request) -> EventHub:
    return request.app.state.hub


JobStoreDep = Annotated[JobStore, Depends(_store)]
BlobStoreDep = Annotated[BlobStore, Depends(_blobs)]
RedisDep = Annotated[aioredis.Redis, Depends(_redis)]
LifecycleDep = Annotated[Lifecycle, Depends(_lifecycle)]
RateLimiterDep = Annotated[RateLimiter, Depends(_limiter)]
RegistryDep = Annotated[ModelRegistry, Depends(_registry)]
DispatcherDep = Annotated[Dispatcher, Depends(_dispatcher)]
SubmissionsDep = Annotated[Submissions, Depends(_submissions)]
EventHubDep = Annotated[EventHub, Depends(_hub)]


_JOB_ID = re.compile(r"[0-9a-f]{32}")


async def _job_if_kept(job_id: str, store: JobStoreDep, principal: PrincipalDep
                       ) -> JobRecord | None:
    """The caller's job, or None when its record is gone (expired, or never made)."""
    if not _JOB_ID.fullmatch(job_id):
        # Not an id this API makes: never a Redis key (`{id}:webhooks` would name another).
        raise JobNotFound(job_id)
    try:
        rec = await store.get(job_id)
    except JobNotFound:
        return None
    if principal.key_id is not None and rec.meta.owner != principal.key_id:
        raise JobNotFound(job_id)  # another key's job: as if it did not exist
    return rec


JobIfKeptDep = Annotated[JobRecord | None, Depends(_job_if_kept)]


async def _job(job_id: str, rec: JobIfKeptDep, store: JobStoreDep) -> JobRecord:
    if rec is None:  # 410 or 404, in services/api/errors.py
        raise missing_job(job_id, store.finished_ttl, time.time())
    return rec


JobDep = Annotated[JobRecord, Depends(_job)]


async def _watchers(request: Request) -> Watchers:
    return request.app.state.watchers


WatchersDep = Annotated[Watchers, Depends(_watchers)]


async def _prefer(
    hub: EventHubDep,
    store: JobStoreDep,
    settings: SettingsDep,
    watchers: WatchersDep,
    principal: PrincipalDep,
    prefer: Annotated[str | None, Header()] = None,
) -> PreferWait:
    return PreferWait(prefer_wait(prefer, settings.max_wait_seconds), hub, store, watchers,
                      bucket_key(principal))


PreferWaitDep = Annotated[PreferWait, Depends(_prefer)]


@dataclass(frozen=True)
class Submitter:
    """A job submitted as the caller of this request: its rate limit, its Idempotency-Key
    and the base URL its job's links start with."""

    submissions: Submissions
    limiter: RateLimiter
    principal: Principal
    idempotency_key: str | None
    base_url: str
    traceparent: str | None = None  # the caller's W3C header: its trace holds the job's

    async def submit(self, req: JobRequest) -> Submitted:
        with tracing.continued(self.traceparent):
            return await self.submissions.submit(req, self.principal, self.idempotency_key,
                                                 self.base_url,
                                                 bucket=self.limiter.bucket(self.principal))


async def _submitter(
    request: Request,
    submissions: SubmissionsDep,
    limiter: RateLimiterDep,
    principal: PrincipalDep,
    idempotency_key: Annotated[str | None, Header()] = None,
) -> Submitter:
    return Submitter(submissions, limiter, principal, idempotency_key,
                     str(request.base_url).rstrip("/"), request.headers.get("traceparent"))


SubmitterDep = Annotated[Submitter, Depends(_submitter)]
