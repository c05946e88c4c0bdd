"""Assemble a job's output from its sub-results, in input order, and finish the job."""

from services.api import metrics
from services.api.envelope import output_url
from shared.job import JobError, JobStatus
from shared.jobstore import JobRecord, JobStore
from shared.subrequest import SubResult


def assemble(rec: JobRecord, results: dict[int, SubResult], base_url: str) -> list[dict | None]:
    out: list[dict | None] = []
    for i in range(rec.total):
        r = results.get(i)
        if r is None or r.output is None:
            out.append(None)
            continue
        item = dict(r.output)
        if rec.task == "image-generation":
            item = {"url": output_url(base_url, rec.id, i), **item}
        item["worker"] = r.worker
        out.append(item)
    return out


def first_error(results: dict[int, SubResult]) -> tuple[int, JobError] | None:
    failed = sorted((i, r.error) for i, r in results.items() if r.error is not None)
    return failed[0] if failed else None


async def finish(
    store: JobStore,
    rec: JobRecord,
    status: JobStatus,
    results: dict[int, SubResult],
    base_url: str,
    error: JobError | None = None,
) -> bool:
    """Make the job final once; only the caller whose change wins counts it in the metrics."""
    changed = await store.finalize(rec.id, status, assemble(rec, results, base_url), error)
    if changed:
        final = await store.get(rec.id)
        labels = (rec.task, rec.model)
        metrics.JOBS_FINISHED.labels(*labels, status.value).inc()
        if final.completed_at is not None:
            metrics.JOB_DURATION.labels(*labels).observe(final.completed_at - final.created_at)
            if final.started_at is not None:
                metrics.JOB_QUEUE.labels(*labels).observe(final.started_at - final.created_at)
                metrics.JOB_RUN.labels(*labels).observe(final.completed_at - final.started_at)
    return changed


async def settle(store: JobStore, job_id: str, base_url: str) -> JobStatus | None:
    """Look at a job's sub-results and make it final when it can be; returns the new status."""
    rec = await store.get(job_id)
    if rec.final:
        return None
    results = await store.results(job_id)
    failed = first_error(results)
    if failed is not None:
        # Fail fast: the rest of the job would be thrown away anyway.
        index, err = failed
        error = JobError(code=err.code, message=f"sub-request {index}: {err.message}")
        if await finish(store, rec, JobStatus.FAILED, results, base_url, error):
            return JobStatus.FAILED
    elif len(results) >= rec.total and await finish(
        store, rec, JobStatus.SUCCEEDED, results, base_url
    ):
        return JobStatus.SUCCEEDED
    return None
