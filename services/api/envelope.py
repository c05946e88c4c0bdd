"""Turn a stored job record into the Job envelope of the external contract."""

from datetime import UTC, datetime

from shared import tracing
from shared.job import Job, JobMetrics, JobUrls, Progress
from shared.jobstore import JobRecord


def _dt(ts: float | None) -> datetime | None:
    return datetime.fromtimestamp(ts, UTC) if ts is not None else None


def job_path(job_id: str) -> str:
    return f"/v1/jobs/{job_id}"


def output_url(base: str, job_id: str, index: int) -> str:
    return f"{base}{job_path(job_id)}/outputs/{index}"


def base_url(rec: JobRecord, public_url: str) -> str:
    """Where the job's links start: FIBERMILL_PUBLIC_URL when set, else the base URL of the
    request that submitted it, so a webhook receiver gets links it can follow."""
    return public_url.rstrip("/") or (rec.meta.base_url or "")


def envelope(rec: JobRecord, public_url: str = "") -> Job:
    metrics = JobMetrics()
    if rec.started_at is not None:
        metrics.queue_seconds = round(rec.started_at - rec.created_at, 6)
        if rec.completed_at is not None:
            metrics.run_seconds = round(rec.completed_at - rec.started_at, 6)
    path = base_url(rec, public_url) + job_path(rec.id)
    return Job(
        id=rec.id,
        task=rec.task,
        model=rec.model,
        status=rec.status,
        input=rec.input,
        output=rec.output,
        error=rec.error,
        progress=Progress(done=min(rec.done, rec.total), total=rec.total),
        created_at=_dt(rec.created_at),
        started_at=_dt(rec.started_at),
        completed_at=_dt(rec.completed_at),
        metrics=metrics,
        urls=JobUrls(get=path, cancel=f"{path}/cancel", events=f"{path}/events"),
        priority=rec.meta.priority,
        deadline_seconds=rec.meta.deadline_seconds,
        webhook=str(rec.meta.webhook) if rec.meta.webhook else None,
        webhook_events_filter=rec.meta.webhook_events_filter,
        webhook_deliveries=rec.webhook_deliveries,
        trace_id=tracing.trace_id(rec.meta.traceparent),
        timeline=rec.timeline,
    )
