"""Accept a job: check it, then store it and send its sub-requests in one step."""

import secrets
from dataclasses import dataclass

import redis.asyncio as aioredis

from services.api import idempotency, metrics
from services.api.auth import Principal
from services.api.backpressure import QueueDepths
from services.api.context_window import ContextWindows
from services.api.dispatch import Dispatcher
from services.api.quotas import Quotas
from services.api.webhooks.ssrf import check_webhook_url
from shared import tracing
from shared.errors import InvalidInput, NotReplicated, Problem
from shared.inputs import TaskInput, TextGenerationInput, validate_input
from shared.job import BATCH_PRIORITY, JobMeta, JobOptions, JobRequest, JobStatus
from shared.job_ids import new_job_id
from shared.jobstore import JobRecord, JobStore, NewJob
from shared.registry import ModelRegistry, ModelSpec
from shared.settings import Settings
from shared.token_bucket import TokenBucket


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
        self.windows = ContextWindows()
        self.quotas = Quotas(redis, settings)

    async def submit(
        self, req: JobRequest, principal: Principal, idempotency_key: str | None,
        base_url: str | None = None, job_id: str | None = None,
        bucket: TokenBucket | None = None, watched: bool = False, batch: bool = False,
    ) -> Submitted:
        """Accept a job (see `_accept`), in the span that starts its trace when tracing is on
        (the request's server span, or a submit span: tracing.submitted): the job keeps that
        span's traceparent, and every span of the job is under it."""
        with tracing.submitted("fibermill.submit", {"fibermill.model": req.model}) as span:
            done = await self._accept(req, principal, idempotency_key, base_url, job_id, bucket,
                                      watched, batch)
            if span is not None:
                span.set_attributes({"fibermill.job_id": done.job.id,
                                     "fibermill.outputs": done.job.total,
                                     "fibermill.created": done.created})
            return done

    async def _accept(
        self, req: JobRequest, principal: Principal, idempotency_key: str | None,
        base_url: str | None = None, job_id: str | None = None,
        bucket: TokenBucket | None = None, watched: bool = False, batch: bool = False,
    ) -> Submitted:
        """`job_id`, when given, is the new job's id (from `new_job_id()`): a caller that
        listens to the job's events subscribes before the job exists, and misses none.
        `bucket`, when given, is the caller's rate limit: the new job takes a token from it as
        it is stored, or RateLimited is raised and nothing is stored. `watched`: the caller
        streams the job's live events (see JobStore.watch). `batch`: a batch's line, queued
        in the batch step below every interactive priority and within its key's share of the
        model's queue (services/api/quotas.py) instead of the interactive backlog's limit."""
        if batch:
            req = req.model_copy(update={"priority": BATCH_PRIORITY})
        spec, inp = await self._check(req, idempotency_key)
        # Of the body as sent (its task filled in, so leaving it out means the same), before a
        # seed is chosen; only an Idempotency-Key needs it.
        digest = (idempotency.body_digest({**req.model_dump(mode="json"), "task": spec.task})
                  if idempotency_key is not None else "")
        _choose_seed(inp)
        probe = _probe(spec, inp, principal.key_id, job_id or new_job_id(),
                       tracing.current_traceparent())
        # Split before storing, so a job that cannot be split is never accepted.
        subs = self.dispatcher.subrequests(probe)
        async with self.claims.hold(
            principal.key_id, idempotency_key, digest, probe.id, self.store.get
        ) as earlier:
            if earlier is not None:
                return Submitted(earlier, created=False)
            # After the Idempotency-Key: replaying an accepted job must not get a 503.
            reserved = None  # a batch line's room in its key's share of the model's queue
            if batch:
                reserved = await self.quotas.reserve_batch_work(principal.key_id, spec,
                                                                probe.id, len(subs))
            else:
                await self.depths.check(spec, len(subs))
            # Stored and sent in one step: a job is never left half-sent.
            enqueue = self.dispatcher.messages(subs, req.priority) if subs else None
            meta = JobMeta(**req.model_dump(include=set(JobOptions.model_fields)),
                           owner=principal.key_id, idempotency_key=idempotency_key,
                           base_url=base_url, traceparent=probe.meta.traceparent)
            job = NewJob(probe.id, probe.task, probe.model, probe.input, len(subs), meta,
                         watched=watched)
            unreplicated: NotReplicated | None = None
            try:
                rec = await self.store.create(job, enqueue=enqueue, bucket=bucket)
            except NotReplicated as exc:
                # Stored, and it will run: the Idempotency-Key is bound to it (a retry returns
                # it), and the caller hears that a failover now could lose it.
                unreplicated, rec = exc, exc.job
            except BaseException:
                if reserved is not None:
                    await self.quotas.release_batch_work(principal.key_id, spec.name, reserved)
                raise
        # Counted once the job exists (it will reach a final status and be counted finished):
        # an Idempotency-Key replay is not a new job.
        metrics.JOBS_SUBMITTED.labels(spec.task, spec.name).inc()
        if not batch:
            self.depths.added(spec.name, len(subs))
        if enqueue is None:
            await self.store.mark_dispatched(rec.id)  # nothing to send
        if unreplicated is not None:
            raise unreplicated
        return Submitted(rec, created=True)

    async def _check(
        self, req: JobRequest, idempotency_key: str | None
    ) -> tuple[ModelSpec, TaskInput]:
        """The model's spec and the typed input, once the request fits its model and the
        server's limits; otherwise every problem found, at once (InvalidInput), and then
        the prompts that do not fit the model's context (ContextLengthExceeded)."""
        problems: list[Problem] = []
        spec: ModelSpec | None = None
        inp: TaskInput | None = None
        try:
            spec = self.registry.get(req.model)
        except InvalidInput as exc:
            problems += exc.problems
        if spec is not None:
            if req.task is not None and req.task != spec.task:
                problems.append(Problem(
                    "task", f"model {spec.name} serves {spec.task}, not {req.task} "
                    "(leave task out and the model's own is used)"))
            try:
                inp = validate_input(spec, req.input)
            except InvalidInput as exc:
                problems += exc.problems
        limit = self.settings.max_deadline_seconds
        if req.deadline_seconds is not None and req.deadline_seconds > limit:
            problems.append(Problem("deadline_seconds", f"must be at most {limit:g} seconds"))
        if req.webhook is not None:
            try:
                await check_webhook_url(str(req.webhook), self.settings.webhook_allow_private)
            except InvalidInput as exc:
                problems += exc.problems
        if idempotency_key is not None and len(idempotency_key) > idempotency.MAX_KEY_LENGTH:
            problems.append(Problem(
                "Idempotency-Key", f"must be at most {idempotency.MAX_KEY_LENGTH} characters"))
        if problems or spec is None or inp is None:
            raise InvalidInput.of(problems)
        if isinstance(inp, TextGenerationInput):
            # Counted once the rest is valid: a count needs the prompts and budget it checks.
            await self.windows.fit(spec, inp)
        return spec, inp


class BatchLines:
    """The batch driver's submitter: `submit` as the driver calls it, each line a batch job
    (`Submissions.submit` with batch=True). A line put off (its key's share of the queue is
    full: QuotaExceeded, a RateLimited) is tried again by the driver; nothing fails."""

    def __init__(self, submissions: Submissions) -> None:
        self.submissions = submissions

    async def submit(self, req: JobRequest, principal: Principal, idempotency_key: str | None,
                     base_url: str | None = None) -> Submitted:
        return await self.submissions.submit(req, principal, idempotency_key, base_url,
                                             batch=True)


def _choose_seed(inp: TaskInput) -> None:
    if inp.seed is None:
        # Stored with the job, so every job can be reproduced from its own record.
        inp.seed = secrets.randbelow(2**31 - 1)


def _probe(spec: ModelSpec, inp: TaskInput, owner: str | None, job_id: str,
           traceparent: str | None) -> JobRecord:
    """The record the job will have, for splitting it before it is stored (its sub-requests
    carry the owner, whose outputs are filed under it, and the job's trace)."""
    return JobRecord(job_id, spec.task, spec.name, JobStatus.QUEUED,
                     inp.model_dump(mode="json"), 0, 0.0,
                     meta=JobMeta(owner=owner, traceparent=traceparent))
