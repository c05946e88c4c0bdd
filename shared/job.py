"""The Job envelope returned by the API and the request that creates a job."""

from datetime import datetime
from enum import StrEnum
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from shared.inputs import ImageGenerationInput, TextGenerationInput


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


class TextJobRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")
    task: Literal["text-generation"]
    model: str
    input: TextGenerationInput


class ImageJobRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")
    task: Literal["image-generation"]
    model: str
    input: ImageGenerationInput


JobRequest = Annotated[TextJobRequest | ImageJobRequest, Field(discriminator="task")]


class JobError(BaseModel):
    code: str
    message: str


class Progress(BaseModel):
    done: int
    total: int


class JobMetrics(BaseModel):
    queue_seconds: float | None = None
    run_seconds: float | None = None


class JobUrls(BaseModel):
    get: str
    cancel: str
    events: str


class Job(BaseModel):
    id: str
    task: str
    model: str
    status: JobStatus
    input: dict[str, Any]
    output: list[dict[str, Any] | None] | None = None
    error: JobError | None = None
    progress: Progress
    created_at: datetime
    started_at: datetime | None = None
    completed_at: datetime | None = None
    metrics: JobMetrics
    urls: JobUrls
