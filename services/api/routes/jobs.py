"""/v1/jobs: create, read, cancel, stream events, fetch outputs."""

import contextlib
import json
from typing import Annotated, Literal

from fastapi import APIRouter, Body, Depends, Query, Request, Response
from sse_starlette import EventSourceResponse
from starlette.background import BackgroundTask

from services.api.auth import PrincipalDep, authenticate
from services.api.deps import (
    BlobStoreDep,
    EventHubDep,
    JobDep,
    JobIfKeptDep,
    JobStoreDep,
    LifecycleDep,
    PreferWaitDep,
    RedisDep,
    SettingsDep,
    SubmitterDep,
    WatchersDep,
)
from services.api.envelope import envelope
from services.api.events import job_events
from services.api.openapi import JOB_EXAMPLES, errors
from services.api.outputs import output_response
from services.api.queue_position import queue_position
from services.api.ratelimit import bucket_key
from shared.job import Job, JobList, JobRequest

router = APIRouter(prefix="/v1/jobs", tags=["jobs"], dependencies=[Depends(authenticate)])


@router.post(
    "",
    status_code=202,
    response_model=Job,
    responses={200: {"model": Job, "description": "The job is final within `Prefer: wait`, "
                     "or an Idempotency-Key replayed an earlier job"},
               202: {"description": "Accepted: the job is queued (or running)"},
               **errors(401, 409, 413, 422, 429, 503)},
)
async def create_job(
    req: Annotated[JobRequest, Body(openapi_examples=JOB_EXAMPLES)],
    response: Response,
    submitter: SubmitterDep,
    prefer_wait: PreferWaitDep,
    settings: SettingsDep,
) -> Job:
    """Accept a job; its sub-requests are queued at once. Headers: `Idempotency-Key` makes
    a retry return the first job instead of a second one; `Prefer: wait=N` holds the answer
    up to N seconds for the job to finish."""
    done = await submitter.submit(req)
    rec = await prefer_wait.apply(done.job, response)
    if rec.final or not done.created:
        response.status_code = 200
    job = envelope(rec, settings.public_url)
    response.headers["Location"] = job.urls.get
    return job


@router.get("", response_model=JobList, responses=errors(401, 422))
async def list_jobs(
    principal: PrincipalDep,
    store: JobStoreDep,
    settings: SettingsDep,
    limit: Annotated[int, Query(ge=1, le=100)] = 20,
) -> JobList:
    """The caller's most recent jobs (those of its API key, or all when the API is open)."""
    recs = await store.recent(principal.key_id, limit)
    return JobList(jobs=[envelope(r, settings.public_url) for r in recs])


@router.get("/{job_id}", response_model=Job, responses=errors(401, 404, 410, 422))
async def get_job(job: JobDep, response: Response, prefer_wait: PreferWaitDep,
                  settings: SettingsDep, redis: RedisDep, store: JobStoreDep,
                  include: Annotated[Literal["timeline"] | None, Query(description=(
                      "timeline: add each output's queued, leased, started and finished "
                      "times, attempts and worker (`timeline`)"))] = None) -> Job:
    """The job, with its outputs so far; while it is queued, its place in its model's line
    and an estimate of when it starts (`queue`). `Prefer: wait=N` holds the answer up to N
    seconds for the job to finish (a long poll: one request a wait instead of one a tick)."""
    job = await prefer_wait.apply(job, response)
    if include == "timeline":
        # Read again, with its timing: asked for, so no other read pays for parsing it.
        job = await store.get(job.id, timeline=True)
    out = envelope(job, settings.public_url)
    out.queue = await queue_position(redis, job, settings.throughput_window_seconds)
    return out


@router.post("/{job_id}/cancel", response_model=Job, responses=errors(401, 404, 410))
async def cancel_job(job: JobDep, lifecycle: LifecycleDep, settings: SettingsDep) -> Job:
    """Cancel the job: outputs not finished stop at their next step. A final job is returned
    as it is."""
    return envelope(await lifecycle.cancel(job), settings.public_url)


@router.get("/{job_id}/events", response_class=EventSourceResponse,
            responses={200: {"content": {"text/event-stream": {}}, "description": (
                "Server-Sent Events: `status` (the job), `progress` ({done, total}), `step` "
                "({index, step, steps}) while outputs run, `output` ({index, text, tokens, "
                "finish_reason, prompt_tokens}: text as it is decoded, text jobs only; an "
                "index's texts in order add up to its output's text); ends after the final "
                "status")},
                       **errors(401, 404, 410, 429)})
async def stream_events(
    request: Request, job: JobDep, hub: EventHubDep, store: JobStoreDep, settings: SettingsDep,
    watchers: WatchersDep, principal: PrincipalDep,
) -> EventSourceResponse:
    state = request.app.state
    # The stream's place is taken now, before anything awaits: checked here and taken when the
    # stream started, streams opened at once all passed the check. It is given back when the
    # stream ends, or when the response ends without the stream having run.
    slot = contextlib.ExitStack()
    slot.enter_context(watchers.hold(bucket_key(principal)))

    def draining() -> bool:
        # End the stream cleanly at SIGTERM; the client's EventSource reconnects elsewhere.
        return getattr(state, "draining", False)

    async def events():
        try:
            async for event, data in job_events(
                hub, store, job.id, settings.public_url, stop=draining
            ):
                yield {"event": event, "data": _json(data)}
        finally:
            slot.close()

    # Closing a slot twice is harmless: the stream's end and the response's both do.
    return EventSourceResponse(events(), ping=15, background=BackgroundTask(slot.close))


def _json(data: dict) -> str:
    return json.dumps(data, separators=(",", ":"))


@router.get(
    "/{job_id}/outputs/{index}",
    responses={200: {"content": {"image/png": {}, "application/json": {}}, "description": (
        "An image output as PNG; a text output as JSON ({\"output\": {text, finish_reason, "
        "tokens}})")}, **errors(401, 404, 410, 422)},
)
async def get_output(job_id: str, job: JobIfKeptDep, index: int, principal: PrincipalDep,
                     store: JobStoreDep, blobs: BlobStoreDep, settings: SettingsDep
                     ) -> Response:
    """An output: an image as PNG (or a redirect to a presigned URL of it, when the server is
    set up so), a text as JSON. An image is kept longer than its job's record
    (`FIBERMILL_OUTPUT_TTL_SECONDS`, 7 days by default), and is 410 Gone after that."""
    return await output_response(job_id, job, index, principal.key_id, store, blobs, settings)
