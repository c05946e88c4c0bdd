"""Metrics of jobs reaching a final status, counted by the process that made them final: an API
replica (the joiner, cancels, deadlines) or, for a job of one sub-request that succeeded, the
worker that stored its result. Histograms and counters, so they add up across processes."""

from prometheus_client import Counter, Histogram

LATENCY_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600, 1800, 3600)

JOBS_FINISHED = Counter(
    "fibermill_jobs_finished", "Jobs that reached a final status", ["task", "model", "status"]
)
JOB_DURATION = Histogram(
    "fibermill_job_duration_seconds",
    "Job time from submit to final status",
    ["task", "model"],
    buckets=LATENCY_BUCKETS,
)
JOB_QUEUE = Histogram(
    "fibermill_job_queue_seconds",
    "Job time from submit to its first sub-request starting",
    ["task", "model"],
    buckets=LATENCY_BUCKETS,
)
JOB_RUN = Histogram(
    "fibermill_job_run_seconds",
    "Job time from its first sub-request starting to final status",
    ["task", "model"],
    buckets=LATENCY_BUCKETS,
)


def observe_final(task: str, model: str, status: str, created_at: float,
                  started_at: float | None, completed_at: float | None) -> None:
    JOBS_FINISHED.labels(task, model, status).inc()
    if completed_at is None:
        return
    JOB_DURATION.labels(task, model).observe(completed_at - created_at)
    if started_at is not None:
        JOB_QUEUE.labels(task, model).observe(started_at - created_at)
        JOB_RUN.labels(task, model).observe(completed_at - started_at)
