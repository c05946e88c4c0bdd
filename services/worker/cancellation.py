"""Stop running sub-requests of jobs that became final (canceled, failed, past deadline).

The API publishes a `CancelNotice` the moment a job becomes final; the heartbeat also checks
the jobs this worker holds (`sweep`), so a missed notice costs one heartbeat, not the whole run.
The same connection hears the jobs a live stream began to watch (`names.WATCH_CHANNEL`), whose
held sub-requests then publish their events; a missed one costs that stream only the events
until the result (its final output event is the script's to publish, which reads the record).
"""

import asyncio
import logging

import redis.asyncio as aioredis

from services.worker.flights import Flights
from shared import names
from shared import redis_replies as replies
from shared.asyncio_compat import raise_if_cancelled
from shared.job import FINAL_STATUSES
from shared.messages import CancelNotice, JobError

log = logging.getLogger(__name__)

WATCH = names.WATCH_CHANNEL.encode()


class CancelListener:
    def __init__(self, redis: aioredis.Redis, flights: Flights) -> None:
        self.redis = redis
        self.flights = flights

    async def run(self) -> None:
        while True:
            raise_if_cancelled()
            pubsub = self.redis.pubsub()
            try:
                await pubsub.subscribe(names.CANCEL_CHANNEL, names.WATCH_CHANNEL)
                async for msg in pubsub.listen():
                    if msg["type"] != "message":
                        continue
                    if msg["channel"] == WATCH:
                        self.flights.watch_job(msg["data"].decode())
                    else:
                        await self._stop(CancelNotice.decode(msg["data"]).job_id)
            except asyncio.CancelledError:
                raise
            except Exception:  # Redis went away: resubscribe after a pause
                log.warning("cancel listener lost Redis; resubscribing", exc_info=True)
                await asyncio.sleep(1)
            finally:
                await pubsub.aclose()

    async def sweep(self) -> None:
        """Stop held sub-requests whose job is already final (or gone)."""
        job_ids = self.flights.job_ids()
        if not job_ids:
            return
        async with self.redis.pipeline(transaction=False) as pipe:
            for job_id in job_ids:
                pipe.hget(names.job_key(job_id), "status")
            statuses = await pipe.execute()
        for job_id, status in zip(job_ids, statuses, strict=True):
            if status is None or status.decode() in FINAL_STATUSES:
                await self._stop(job_id)

    async def _stop(self, job_id: str) -> None:
        # Told once: the notice and the next sweep both find a job whose sub-requests are
        # still winding down.
        fresh = sum(not f.stop.is_set() for f in self.flights.of_job(job_id))
        self.flights.stop_job(job_id)
        if fresh and log.isEnabledFor(logging.INFO):
            # Read only by the worker that held some of it, after the stop: it says why.
            log.info("stopping %d sub-request(s) of job %s: %s", fresh, job_id,
                     await self._why(job_id))

    async def _why(self, job_id: str) -> str:
        """What the job became, as the job-end line says it: `status=canceled`,
        `status=failed error=deadline_exceeded`, or `status=gone`."""
        try:
            status, error = await self.redis.hmget(names.job_key(job_id), ["status", "error"])
        except Exception as exc:  # the stop is done; only its reason is missing
            return f"status unknown ({type(exc).__name__})"
        if (status_text := replies.optional_text(status)) is None:
            return "status=gone"
        why = f"status={status_text}"
        if error_raw := replies.optional_raw(error):
            why += f" error={JobError.model_validate_json(error_raw).code}"
        return why
