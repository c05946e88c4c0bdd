"""The worker's heartbeat: announce itself, renew the leases it holds, enforce time limits,
and stop what belongs to jobs that became final."""

import asyncio
import logging
import time

import redis.asyncio as aioredis

from services.worker.cancellation import CancelListener
from services.worker.exits import ExitReason, exit_worker
from services.worker.flights import Flights
from services.worker.identity import WorkerIdentity
from shared.asyncio_compat import raise_if_cancelled
from shared.failures import time_limit_exceeded
from shared.jobstore import JobStore
from shared.messages import StopReason, WorkerHeartbeat
from shared.settings import Settings
from shared.workers import announce

log = logging.getLogger(__name__)

# After asking a sub-request to stop, how long to wait for the next step boundary before the
# process exits (a thread cannot be killed; the launcher restarts the process).
HARD_KILL_GRACE_SECONDS = 30.0


class Heartbeat:
    def __init__(self, settings: Settings, identity: WorkerIdentity, models: list[str],
                 redis: aioredis.Redis, store: JobStore, flights: Flights,
                 cancels: CancelListener) -> None:
        self.settings = settings
        self.identity = identity
        self.models = models
        self.redis = redis
        self.store = store
        self.flights = flights
        self.cancels = cancels

    async def run(self) -> None:
        while True:
            raise_if_cancelled()
            try:
                await self.beat()
            except Exception:  # Redis may be briefly away; keep beating
                log.exception("heartbeat failed")
            await self.enforce_time_limits()
            try:
                await self.cancels.sweep()
            except Exception:
                log.exception("checking held jobs failed")
            await asyncio.sleep(self.settings.heartbeat_seconds)

    async def beat(self) -> None:
        me, s = self.identity, self.settings
        info = WorkerHeartbeat(
            id=me.id, name=me.name, host=me.host, pid=me.pid, device=me.device,
            models=self.models, in_flight=len(self.flights), started_at=me.started_at,
            seen_at=time.time(),
        )
        await announce(self.redis, info, s.worker_heartbeat_ttl_seconds)
        await self.store.renew_leases(self.flights.members(), me.id, s.lease_seconds)

    async def enforce_time_limits(self) -> None:
        now = time.time()
        for flight in self.flights:
            if now > flight.deadline:
                flight.request_stop(StopReason.TIME_LIMIT)
            if now > flight.deadline + HARD_KILL_GRACE_SECONDS:
                # Record the failure first, so the sub-request is not re-sent to kill the next
                # worker.
                limit = self.settings.subrequest_time_limit_seconds
                failure = time_limit_exceeded(flight.sub, limit, self.identity.id, flight.started)
                await self.store.store_result(flight.sub.job_id, failure)
                log.critical("sub-request %s ignored its stop for %.0fs", flight.sub.member,
                             HARD_KILL_GRACE_SECONDS)
                exit_worker(ExitReason.STOP_IGNORED_PAST_TIME_LIMIT)
