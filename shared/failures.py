"""The failure records a sub-request can end with when it did not fail by itself, built in one
place whichever process notices: the worker that runs it, its heartbeat, or the janitor."""

import time

from shared.errors import DeadLettered, TimeLimitExceeded
from shared.messages import JobError, SubRequest, SubResult


def time_limit_exceeded(sub: SubRequest, limit: float, worker: str,
                        started_at: float | None = None) -> SubResult:
    return SubResult(
        index=sub.index,
        worker=worker,
        started_at=started_at,
        finished_at=time.time(),
        error=JobError(code=TimeLimitExceeded.code,
                       message=f"sub-request {sub.index} ran past its {limit:g}s limit"),
    )


def dead_lettered(sub: SubRequest, attempts: int, worker: str) -> SubResult:
    return SubResult(
        index=sub.index,
        worker=worker,
        finished_at=time.time(),
        error=JobError(
            code=DeadLettered.code,
            message=f"sub-request {sub.index} was given up after {attempts} attempts: each "
                    "one lost its worker (crash, out of memory or kill)",
        ),
    )
