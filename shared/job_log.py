"""The one line each job writes when it ends, from the process whose script made it final (an
API replica: the joiner, a cancel, a deadline; or, for a job of one prompt that succeeded, the
worker that stored its result). The scripts make a job final once, and say so only to the
caller that did: one line per job, however many replicas there are.

    job 3f9c... failed: model=tiny-gpt2 task=text queued=0.012s running=0.480s total=0.492s
    error=deadline_exceeded

INFO, or WARNING for a failed job. `queued` runs from submission to the first sub-request's
start (to the end for a job that never started), `running` from that start to the end.
"""

import logging
from dataclasses import dataclass

from shared.logs import fields

log = logging.getLogger("fibermill.jobs")


@dataclass(frozen=True)
class JobEnd:
    job_id: str
    task: str
    model: str
    status: str  # succeeded, failed or canceled
    created_at: float
    started_at: float | None
    completed_at: float
    error_code: str | None = None


def job_ended(end: JobEnd) -> None:
    level = logging.WARNING if end.status == "failed" else logging.INFO
    if not log.isEnabledFor(level):
        return
    started = end.started_at if end.started_at is not None else end.completed_at
    queued = max(0.0, started - end.created_at)
    running = max(0.0, end.completed_at - started)
    total = max(0.0, end.completed_at - end.created_at)
    error = f" error={end.error_code}" if end.error_code else ""
    log.log(level, "job %s %s: model=%s task=%s queued=%.3fs running=%.3fs total=%.3fs%s",
            end.job_id, end.status, end.model, end.task, queued, running, total, error,
            extra=fields(event="job_end", job_id=end.job_id, model=end.model, task=end.task,
                         status=end.status, queued_s=round(queued, 3),
                         running_s=round(running, 3), total_s=round(total, 3),
                         error_code=end.error_code))
