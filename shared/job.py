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
MAX_PRIORITY = 9
DEFAULT_PRIORITY = 5


class JobOptions(BaseModel):
    """Request fields beyond the task's input: delivery, priority, deadline."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)
    webhook: AnyHttpUrl | None = None
    webhook_events_filter: list[WebhookEvent] = Field(default_factory=lambda: ["completed"])
    priority: int = Field(DEFAULT_PRIORITY, ge=0, le=MAX_PRIORITY, description="0 is highest")
    deadline_seconds: float | None = Field(None, gt=0)


class JobMeta(JobOptions):
    """What is stored with a job besides its input: the options and who submitted it."""

    owner: str | None = None  # the id of the API key that submitted the job
    idempotency_key: str | None = None

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
    queue_seconds: float | None = None
    run_seconds: float | None = None


class JobUrls(BaseModel):
    get: str
    cancel: str
    events: str


class WebhookDelivery(BaseModel):
    """One attempt to deliver one webhook event."""

    webhook_id: str
    event: WebhookEvent
    attempt: int
    status_code: int | None = None
    error: str | None = None
    at: datetime


class Job(BaseModel):
    id: str
    task: str
    model: str
    status: JobStatus
    input: dict[str, Any]
    output: list[TextOutput | ImageOutput | None] | None = None
    error: JobError | None = None
    progress: Progress
    created_at: datetime
    started_at: datetime | None = None
    completed_at: datetime | None = None
    metrics: JobMetrics
    urls: JobUrls
    priority: int = DEFAULT_PRIORITY
    deadline_seconds: float | None = None
    webhook: str | None = None
    webhook_events_filter: list[WebhookEvent] = Field(default_factory=lambda: ["completed"])
    webhook_deliveries: list[WebhookDelivery] = Field(default_factory=list)


class JobList(BaseModel):
    jobs: list[Job]
