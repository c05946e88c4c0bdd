"""The worker's heartbeat: announce itself, renew the leases it holds, enforce time limits."""

import asyncio
import logging
import os
import socket
import time

from services.worker.cancellation import stop_finished_jobs
from services.worker.runtime import WorkerRuntime
from shared.asyncio_compat import raise_if_cancelled
from shared.errors import TimeLimitExceeded
from shared.job import JobError
from shared.subrequest import SubResult
from shared.workers import WorkerInfo, announce

log = logging.getLogger(__name__)

# After asking a sub-request to stop, how long to wait for the next step boundary before the
# process exits (a thread cannot be killed; the launcher restarts the process).
HARD_KILL_GRACE_SECONDS = 30.0


async def heartbeat_loop(rt: WorkerRuntime) -> None:
    s = rt.settings
    while True:
        raise_if_cancelled()
        try:
            await beat(rt)
        except Exception:  # Redis may be briefly away; keep beating
            log.exception("heartbeat failed")
        await enforce_time_limits(rt)
        try:
            await stop_finished_jobs(rt)
        except Exception:
            log.exception("checking held jobs failed")
        await asyncio.sleep(s.heartbeat_seconds)


async def beat(rt: WorkerRuntime) -> None:
    s = rt.settings
    now = time.time()
    info = WorkerInfo(
        id=rt.id,
        name=rt.name,
        host=socket.gethostname(),
        pid=os.getpid(),
        device=str(rt.device),
        models=list(rt.engines),
        in_flight=len(rt.in_flight),
        started_at=rt.started_at,
        seen_at=now,
    )
    await announce(rt.redis, info, s.worker_heartbeat_ttl_seconds)
    await rt.store.renew_leases(list(rt.in_flight), rt.id, s.lease_seconds)


async def enforce_time_limits(rt: WorkerRuntime) -> None:
    now = time.time()
    for flight in list(rt.in_flight.values()):
        if now > flight.deadline:
            flight.request_stop("time_limit")
        if now > flight.deadline + HARD_KILL_GRACE_SECONDS:
            # Record the failure first, so the sub-request is not re-sent to kill the next worker.
            limit = rt.settings.subrequest_time_limit_seconds
            await rt.store.store_result(
                flight.sub.job_id,
                SubResult(
                    index=flight.sub.index,
                    worker=rt.id,
                    started_at=flight.started,
                    finished_at=now,
                    error=JobError(
                        code=TimeLimitExceeded.code,
                        message=f"sub-request {flight.sub.index} ran past its {limit}s limit",
                    ),
                ),
            )
            log.critical(
                "sub-request %s ignored its stop for %.0fs; exiting so the launcher "
                "restarts this worker",
                flight.sub.member,
                HARD_KILL_GRACE_SECONDS,
            )
            os._exit(70)
