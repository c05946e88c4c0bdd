"""Stop running sub-requests of jobs that became final (canceled, failed, past deadline).

The API publishes the job id on a channel the moment the job becomes final; the heartbeat
also checks the jobs it holds, so a missed message costs one heartbeat, not the whole run.
"""

import asyncio
import logging

from services.worker.runtime import WorkerRuntime
from shared import names
from shared.asyncio_compat import raise_if_cancelled
from shared.job import FINAL_STATUSES

log = logging.getLogger(__name__)


async def listen_for_cancels(rt: WorkerRuntime) -> None:
    while True:
        raise_if_cancelled()
        pubsub = rt.redis.pubsub()
        try:
            await pubsub.subscribe(names.CANCEL_CHANNEL)
            async for msg in pubsub.listen():
                if msg["type"] == "message":
                    job_id = msg["data"].decode()
                    if rt.stop_job(job_id):
                        log.info("stopping the sub-requests of job %s", job_id)
        except asyncio.CancelledError:
            raise
        except Exception:  # Redis went away: resubscribe after a pause
            log.warning("cancel listener lost Redis; resubscribing", exc_info=True)
            await asyncio.sleep(1)
        finally:
            await pubsub.aclose()


async def stop_finished_jobs(rt: WorkerRuntime) -> None:
    """The heartbeat's fallback: stop sub-requests whose job is already final."""
    job_ids = sorted({f.sub.job_id for f in rt.in_flight.values()})
    if not job_ids:
        return
    async with rt.redis.pipeline(transaction=False) as pipe:
        for job_id in job_ids:
            pipe.hget(names.job_key(job_id), "status")
        statuses = await pipe.execute()
    for job_id, status in zip(job_ids, statuses, strict=True):
        if status is None or status.decode() in FINAL_STATUSES:
            rt.stop_job(job_id)
