"""The worker's side of the SIGTERM drain: past `FIBERMILL_DRAIN_SECONDS`, stop what is still
held and hand it back to its queue. The whole drain, Celery's part and this one, and why each
step is safe, is told once in docs/architecture.md ("Drain (SIGTERM)")."""

import asyncio
import logging
import time

from celery import Celery

from services.worker.exits import ExitReason, exit_worker
from services.worker.flights import Flights, InFlight
from shared.errors import JobNotFound
from shared.jobstore import JobStore
from shared.messages import StopReason
from shared.sending import send_subrequests
from shared.settings import Settings

log = logging.getLogger(__name__)

# After the drain deadline, how long stopped sub-requests get to reach a step boundary.
DRAIN_STOP_GRACE_SECONDS = 5.0


def handback_owner(worker_id: str) -> str:
    return f"{worker_id}#handback"


class Drainer:
    def __init__(self, settings: Settings, worker_id: str, store: JobStore, flights: Flights,
                 celery: Celery) -> None:
        self.settings = settings
        self.worker_id = worker_id
        self.store = store
        self.flights = flights
        self.celery = celery
        self.draining = False  # SIGTERM seen: finishing what the worker holds
        self.expired = False  # past the drain deadline: handing back what is left
        self._lost: asyncio.Task | None = None  # the exit after the device failed

    async def watch(self, deadline: float) -> None:
        """At the drain deadline (time.monotonic), stop what is still held; exit if it will
        not stop."""
        await asyncio.sleep(max(0.0, deadline - time.monotonic()))
        await self._hand_back_all("drain deadline passed", ExitReason.STOP_IGNORED_IN_DRAIN)

    def device_lost(self) -> None:
        """The device failed for good (engine/device_faults.py): take no more work, hand back
        what is held, as at the drain deadline, and exit for the launcher to start a clean
        process. Called on the runtime loop by each sub-request the failure ended; the first
        call starts it."""
        if self._lost is None:
            self._lost = asyncio.get_running_loop().create_task(self._exit_device_lost())

    async def _exit_device_lost(self) -> None:
        await self._hand_back_all("the device failed", ExitReason.DEVICE_LOST)
        exit_worker(ExitReason.DEVICE_LOST)

    async def _hand_back_all(self, why: str, stuck_exit: ExitReason) -> None:
        """Stop what is held and wait for it to go back; exit with `stuck_exit` if it will
        not stop."""
        self.expired = True
        if n := self.flights.stop_all(StopReason.DRAIN):
            log.warning("%s: stopping %d sub-request(s) to hand them back", why, n)
        end = time.monotonic() + DRAIN_STOP_GRACE_SECONDS
        while time.monotonic() < end:
            if not self.flights:
                return
            self.flights.stop_all(StopReason.DRAIN)  # one that arrived after the deadline
            await asyncio.sleep(0.05)
        stuck = list(self.flights)
        for flight in stuck:
            self.flights.remove(flight.sub.member)  # no more renewals
            try:
                await self.expire_lease(flight)
            except Exception:  # Redis away: the lease simply expires
                log.exception("could not expire the lease of %s", flight.sub.member)
        log.critical("%s: %d sub-request(s) did not stop within %.0fs; the janitor re-sends "
                     "them", why, len(stuck), DRAIN_STOP_GRACE_SECONDS)
        exit_worker(stuck_exit)

    async def expire_lease(self, flight: InFlight) -> bool:
        """Give up the lease so any delivery (or the janitor) can take it at once, and the
        attempt it was charged if it started."""
        return await self.store.hand_back_lease(flight.sub, self.worker_id,
                                                handback_owner(self.worker_id), flight.charged)

    async def hand_back(self, flight: InFlight) -> str:
        """Give a stopped sub-request back to its queue. Returns what happened to it."""
        sub = flight.sub
        if not await self.expire_lease(flight):
            return "lost_lease"  # the janitor took it already and re-sends it
        try:
            rec = await self.store.get(sub.job_id)
        except JobNotFound:
            rec = None
        if rec is not None and not rec.final:
            try:
                await self.store.mark_sent(sub.model, [sub.member])
                await send_subrequests(self.celery, [sub], rec.meta.priority)
            except Exception:
                log.exception("could not send %s back to its queue; the janitor will",
                              sub.member)
                return "janitor"
        await self.store.release_lease(sub.member, handback_owner(self.worker_id))
        return "sent" if rec is not None and not rec.final else "final"
