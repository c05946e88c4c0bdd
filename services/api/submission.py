"""Accept a job: check it against the model's limits, store it, send its sub-requests."""

import secrets
import uuid

from services.api import metrics
from services.api.dispatch import Dispatcher
from shared.errors import InvalidInput
from shared.job import ImageJobRequest, JobStatus, TextJobRequest
from shared.jobstore import JobRecord, JobStore
from shared.registry import ModelRegistry


async def submit(
    req: TextJobRequest | ImageJobRequest,
    store: JobStore,
    registry: ModelRegistry,
    dispatcher: Dispatcher,
) -> JobRecord:
    spec = registry.get(req.model)
    if spec.task != req.task:
        raise InvalidInput("task", f"model {req.model} serves {spec.task}, not {req.task}")
    req.input.check_limits(spec)
    if req.input.seed is None:
        # Stored with the job, so every job can be reproduced from its own record.
        req.input.seed = secrets.randbelow(2**31 - 1)
    job_id = uuid.uuid4().hex
    rec_input = req.input.model_dump(mode="json")
    # Build the sub-requests before storing, so a job that cannot be split is never accepted.
    probe = JobRecord(job_id, req.task, req.model, JobStatus.QUEUED, rec_input, 0, 0.0)
    subs = dispatcher.subrequests(probe)
    rec = await store.create(job_id, req.task, req.model, rec_input, total=len(subs))
    await dispatcher.send(subs)
    await store.mark_dispatched(job_id)
    metrics.JOBS_SUBMITTED.labels(req.task, req.model).inc()
    return rec
