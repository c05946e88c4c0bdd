"""The Job envelope returned by the API and the request that creates a job."""

from datetime import datetime
from enum import StrEnum
from typing import Any, Literal

from pydantic import AnyHttpUrl, BaseModel, ConfigDict, Field

from shared.inputs import ImageOutput, TextOutput
from shared.messages import JobError, Progress
from shared.registry import Task


class JobStatus(StrEnum):
    QUEUED = "queued"
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELED = "canceled"

    @property
    def final(self) -> bool:
        return self in FINAL_STATUSES


FINAL_STATUSES = frozenset({JobStatus.SUCCEEDED, JobStatus.FAILED, JobStatus.CANCELED})


WebhookEvent = Literal["start", "progress", "completed"]


def _completed_only() -> list[WebhookEvent]:
    return ["completed"]
MAX_PRIORITY = 9
DEFAULT_PRIORITY = 5
# A batch's lines queue one step below every priority a request may ask for: workers take
# them only while no interactive sub-request of their models waits (shared/celery_config.py).
BATCH_PRIORITY = MAX_PRIORITY + 1


class JobOptions(BaseModel):
    """Request fields beyond the task's input: delivery, priority, deadline."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)
    webhook: AnyHttpUrl | None = Field(None, description=(
        "An http(s) URL that receives the job's events as signed POSTs (Standard Webhooks: "
        "webhook-id, webhook-timestamp and webhook-signature headers)"))
    webhook_events_filter: list[WebhookEvent] = Field(
        default_factory=_completed_only,
        description="Which events go to the webhook: start, progress, completed")
    priority: int = Field(DEFAULT_PRIORITY, ge=0, le=MAX_PRIORITY,
                          description="Queue priority, 0 (first) to 9 (last)")
    deadline_seconds: float | None = Field(None, gt=0, description=(
        "Seconds from submission after which the job fails with deadline_exceeded if it has "
        "not finished; outputs not started by then are never run"))


class JobMeta(JobOptions):
    """What is stored with a job besides its input: the options and who submitted it."""

    # As asked, or BATCH_PRIORITY for a batch's line: a resent sub-request keeps its step.
    priority: int = Field(DEFAULT_PRIORITY, ge=0, le=BATCH_PRIORITY)
    owner: str | None = None  # the id of the API key that submitted the job
    idempotency_key: str | None = None
    # The base URL the job was submitted to: its links start there unless FIBERMILL_PUBLIC_URL
    # says otherwise.
    base_url: str | None = None
    # The job's trace: a W3C traceparent naming its submit span (shared/tracing.py); None when
    # the API that stored it did not trace.
    traceparent: str | None = None

    def wants(self, event: WebhookEvent) -> bool:
        return self.webhook is not None and event in self.webhook_events_filter


class JobRequest(JobOptions):
    """A job as submitted: the model, its task (inferred from the model when absent) and the
    task's input, checked against that model's limits once the model is known."""

    task: Task | None = Field(
        None, description="The model's task; inferred from `model` when absent, and checked "
        "against it when given")
    model: str = Field(description="A model name from GET /v1/models")
    input: dict[str, Any] = Field(
        description="The task's input: TextGenerationInput for text-generation models, "
        "ImageGenerationInput for image-generation models")


class JobMetrics(BaseModel):
    queue_seconds: float | None = Field(None, description="From submission to its first "
                                        "output starting on a worker")
    run_seconds: float | None = Field(None, description="From its first output starting to "
                                      "the job's end")


class JobUrls(BaseModel):
    get: str = Field(description="GET: the job")
    cancel: str = Field(description="POST: cancel the job")
    events: str = Field(description="GET: the job's live events (Server-Sent Events)")


class QueueBasis(BaseModel):
    """What an estimated start was worked out from: the model's measured throughput."""

    finished: int = Field(description="Outputs of this model finished in the window")
    seconds: float = Field(description="The window they finished in, in seconds: the recent "
                           "time since the model's first finished output in it")
    per_second: float = Field(description="Outputs finished per second (finished / seconds)")


class QueuePosition(BaseModel):
    """Where a queued job stands in its model's line."""

    position: int = Field(description="The job's place in line, counted in outputs (a "
                          "prompt, or an image): 1 when its first output is the next of its "
                          "model's to start; `ahead` + 1")
    ahead: int = Field(description=(
        "Outputs of this model, of any job, not finished and due before this one's first "
        "(running, or waiting at a more urgent priority, or at its own and sent before it). "
        "More urgent work sent after this read can still pass it"))
    estimated_start: datetime | None = Field(None, description=(
        "When its first output should start: now plus `ahead` divided by the model's "
        "measured throughput; null while nothing of the model has finished recently (no "
        "measure, no guess)"))
    basis: QueueBasis | None = Field(None, description="The throughput the estimate is "
                                     "based on; null with no estimate")


class WebhookDelivery(BaseModel):
    """One attempt to deliver one webhook event."""

    webhook_id: str = Field(description="The delivery's webhook-id header, the same on "
                            "every attempt of one event")
    event: WebhookEvent = Field(description="The event delivered")
    attempt: int = Field(description="1 for the first attempt")
    status_code: int | None = Field(None, description="The receiver's answer, if any")
    error: str | None = Field(None, description="Why the attempt failed, if it did")
    at: datetime = Field(description="When the attempt was made")


class SubRequestTiming(BaseModel):
    """How one output's sub-request went, from timestamps the job's record keeps anyway."""

    index: int = Field(description="The output (sub-request) it is")
    queued_at: datetime = Field(description="When it was queued: the job's acceptance")
    leased_at: datetime | None = Field(None, description=(
        "When a worker last took its lease (the Redis server's clock); null while queued"))
    started_at: datetime | None = Field(None, description=(
        "When it started on the device, its batch begun (the worker's clock)"))
    finished_at: datetime | None = Field(None, description=(
        "When its result was made (the worker's clock)"))
    attempts: int = Field(0, description="Times it started on a device")
    worker: str | None = Field(None, description=(
        "The worker process that ran it, or holds it now"))


class Job(BaseModel):
    """A job: what was asked, where it stands, and its outputs in the order of its prompts."""

    id: str = Field(description="The job's id")
    task: str = Field(description="text-generation or image-generation")
    model: str = Field(description="The model that runs it")
    status: JobStatus = Field(description=(
        "queued, running, then one final status: succeeded, failed or canceled"))
    input: dict[str, Any] = Field(description="The input as accepted, with its seed filled in")
    output: list[TextOutput | ImageOutput | None] | None = Field(None, description=(
        "One entry per output, in input order (for images: prompt by prompt, each prompt's "
        "images together); null where an output is not finished or failed"))
    error: JobError | None = Field(None, description="Why the job failed, once it has")
    progress: Progress = Field(description="Outputs finished out of all")
    created_at: datetime = Field(description="When the job was accepted")
    started_at: datetime | None = Field(None, description="When its first output started")
    completed_at: datetime | None = Field(None, description="When it reached a final status")
    metrics: JobMetrics = Field(description="Time spent queued and running")
    urls: JobUrls = Field(description="Links to act on the job")
    priority: int = Field(DEFAULT_PRIORITY, description="Queue priority, 0 (first) to 9")
    deadline_seconds: float | None = Field(None, description="The deadline it was given")
    webhook: str | None = Field(None, description="Where its events are delivered")
    webhook_events_filter: list[WebhookEvent] = Field(
        default_factory=_completed_only, description="Which events are delivered")
    webhook_deliveries: list[WebhookDelivery] = Field(
        default_factory=list, description="Every delivery attempt so far, oldest first")
    queue: QueuePosition | None = Field(None, description=(
        "While it is queued, in GET /v1/jobs/{id}: its place in its model's line and an "
        "estimate of its start; null otherwise"))
    trace_id: str | None = Field(None, description=(
        "Its OpenTelemetry trace (32 hex digits): every span of the job, from this request to "
        "its webhook, when the server traces (OTEL_* settings); null otherwise"))
    timeline: list[SubRequestTiming] | None = Field(None, description=(
        "With GET /v1/jobs/{id}?include=timeline: each output's queued, leased, started and "
        "finished times, attempts and worker; null otherwise"))


class JobList(BaseModel):
    jobs: list[Job] = Field(description="Most recent first")
