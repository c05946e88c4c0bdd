"""The one place where a job moves on: started, progress, and final (succeeded, failed,
canceled, deadline). Every final change notifies (SSE, webhook) and stops running work."""

import logging
import time

from services.api.assembly import assemble, first_error
from services.api.notify import Notifier
from shared import tracing
from shared.errors import DeadlineExceeded
from shared.job import JobStatus
from shared.job_metrics import observe_final
from shared.jobstore import JobRecord, JobStore
from shared.messages import JobError, SubResult

log = logging.getLogger(__name__)


class Lifecycle:
    def __init__(self, store: JobStore, notifier: Notifier, public_url: str) -> None:
        self.store = store
        self.notifier = notifier
        self.public_url = public_url

    async def finish(self, rec: JobRecord, status: JobStatus, error: JobError | None = None,
                     results: dict[int, SubResult] | None = None) -> bool:
        """Make the job final once, keeping the outputs already done; only the caller whose
        change wins counts it and notifies. finalize.lua itself, in the same step, tells the live
        listeners and, unless the job succeeded, the workers (drop what is left of it)."""
        return await self._finish(rec, status, error, results) is not None

    async def _finish(self, rec: JobRecord, status: JobStatus, error: JobError | None = None,
                      results: dict[int, SubResult] | None = None) -> JobRecord | None:
        """The job as it became final, or None when another change made it final first."""
        if results is None:
            results = await self.store.results(rec.id)
        output = [o.model_dump(mode="json") if o else None
                  for o in assemble(rec, results, self.public_url)]
        final = await self.store.finalize_record(rec.id, status, output, error, rec=rec,
                                                 all_results=len(results) >= rec.total)
        if final is None:
            return None
        final.done = len(results)
        _observe(final)
        await self.notifier.completed(final)
        return final

    async def finalized(self, job_id: str) -> None:
        """The stream's `final` entry (written for jobs with a `completed` webhook): make sure
        the webhook is in the outbox even if the replica that finalized the job died before
        enqueueing it (a duplicate is ignored by the outbox)."""
        rec = await self.store.get(job_id)
        await self.notifier.outbox.enqueue(rec, "completed")

    async def started(self, job_id: str) -> None:
        """The stream's `started` entry (written for jobs with a `start` webhook)."""
        rec = await self.store.get(job_id)
        if not rec.final:
            await self.notifier.started(rec)

    async def settle(self, job_id: str) -> JobStatus | None:
        """A sub-result came in: record progress, and finish the job when it can be. Traced
        as the job's `fibermill.join` span, once its record says which trace that is."""
        began = time.time()
        rec, results = await self.store.get_with_results(job_id)
        join = tracing.start("fibermill.join", rec.meta.traceparent, began,
                             {"fibermill.job_id": job_id, "fibermill.done": len(results),
                              "fibermill.outputs": rec.total})
        status = None
        try:
            status = await self._settle(rec, results)
        finally:
            tracing.end(join, attributes={"fibermill.status": (status or rec.status).value})
        return status

    async def _settle(self, rec: JobRecord, results: dict[int, SubResult]) -> JobStatus | None:
        if rec.final:
            return None
        failed = first_error(results)
        if failed is not None:
            # Fail fast: the rest of the job would be thrown away anyway.
            index, err = failed
            error = JobError(code=err.code, message=f"sub-request {index}: {err.message}")
            done = await self.finish(rec, JobStatus.FAILED, error, results)
            return JobStatus.FAILED if done else None
        if len(results) >= rec.total:
            done = await self.finish(rec, JobStatus.SUCCEEDED, results=results)
            return JobStatus.SUCCEEDED if done else None
        await self.notifier.progress(rec)
        return None

    async def cancel(self, rec: JobRecord) -> JobRecord:
        """Cancel a job; canceling a final job changes nothing and returns it as it is."""
        if not rec.final:
            final = await self._finish(rec, JobStatus.CANCELED)
            if final is not None:
                return final
        return await self.store.get(rec.id)

    async def expire(self, job_id: str) -> bool:
        rec = await self.store.get(job_id)
        if rec.final:
            return False
        limit = rec.meta.deadline_seconds
        error = JobError(code=DeadlineExceeded.code,
                         message=f"the job did not finish within its deadline of {limit:g}s")
        return await self.finish(rec, JobStatus.FAILED, error)


def _observe(rec: JobRecord) -> None:
    observe_final(rec.task, rec.model, rec.status.value, rec.created_at, rec.started_at,
                  rec.completed_at)
