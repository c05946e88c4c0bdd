"""The janitor: finds every sub-request that nothing is running or queueing any more, and sends
it again; fails jobs past their deadline.

- A running sub-request holds a lease its worker renews on every heartbeat. When a lease
  expires, the janitor takes it (atomically, so one API replica acts) and sends the sub-request
  again, or dead-letters it once it has used up its attempts. Attempts are charged only when a
  sub-request starts on the device, so a worker lost while merely holding work costs that work
  nothing; one that was running when its worker was lost goes out again `isolated`, to run in a
  batch of its own, so that a batch whose one bad item crashes its worker does not use up the
  attempts of its innocent neighbours.
- A sub-request sent but never leased (services/api/orphans.py) is sent again.
- A job whose creating API process died before it finished dispatching it is sent whole.
- A job past its deadline fails.

Every claim (an expired lease, a stale dispatch, a due deadline) leaves the work findable should
this replica die or fail half-way: a claimed lease becomes an orphan the next sweep finds; a
claimed dispatch or deadline is only pushed back, and removed once done. One item's failure is
logged and the sweep goes on with the next.
"""

import asyncio
import logging
import os
import socket
import time
from collections.abc import Awaitable, Callable

from services.api import metrics
from services.api.dispatch import Dispatcher
from services.api.lifecycle import Lifecycle
from services.api.orphans import Orphan, OrphanFinder
from shared import names
from shared.asyncio_compat import raise_if_cancelled
from shared.errors import JobNotFound
from shared.failures import dead_lettered
from shared.jobstore import JobStore
from shared.messages import SubRequest
from shared.settings import Settings

log = logging.getLogger(__name__)

STALE_DISPATCH_SECONDS = 30.0


class Janitor:
    def __init__(self, store: JobStore, dispatcher: Dispatcher, lifecycle: Lifecycle,
                 settings: Settings) -> None:
        self.store = store
        self.dispatcher = dispatcher
        self.lifecycle = lifecycle
        self.settings = settings
        self.orphans = OrphanFinder(store.redis, settings.lost_after_seconds)
        self._orphans_due = 0.0
        # The owner of the leases this janitor holds while it sends their sub-requests again.
        self.owner = f"janitor:{socket.gethostname()}-{os.getpid()}"

    async def run(self) -> None:
        while True:
            raise_if_cancelled()
            try:
                await self.sweep()
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("janitor sweep failed")
            # Again before sleeping: a cancellation dropped inside the sweep's Redis calls would
            # otherwise hold a shutdown for a whole interval.
            raise_if_cancelled()
            await asyncio.sleep(self.settings.janitor_interval_seconds)

    async def sweep(self) -> int:
        n = 0
        held = await self.store.claim_expired_leases(self.owner, self.settings.lease_seconds)
        for job_id, index in held:
            n += await self._each(self._recover, job_id, index)
        for job_id in await self.store.claim_stale_dispatches(STALE_DISPATCH_SECONDS):
            n += await self._each(self._redispatch, job_id)
        for job_id in await self.store.claim_due_deadlines():
            n += await self._each(self._expire, job_id)
        if time.monotonic() >= self._orphans_due:
            # Each look reads a few keys per model; a lost sub-request waits `lost_after`
            # anyway, so looking a few times within it is enough.
            self._orphans_due = time.monotonic() + self.settings.lost_after_seconds / 4
            n += await self.sweep_orphans()
        return n

    async def sweep_orphans(self) -> int:
        n = 0
        for model in self.dispatcher.registry.models:
            for orphan in await self.orphans.find(model):
                n += await self._each(self._resend_orphan, orphan)
        return n

    async def _each(self, work: Callable[..., Awaitable[int]], *args) -> int:
        try:
            return await work(*args)
        except JobNotFound:
            return 0
        except asyncio.CancelledError:
            raise
        except Exception:
            log.exception("janitor: %s%r failed; it is found again later", work.__name__, args)
            return 0

    async def _recover(self, job_id: str, index: int) -> int:
        """Send again (or dead-letter) a sub-request whose lease this janitor took over, then
        give the lease up; if this fails half-way the lease expires and is taken over again."""
        try:
            return await self._recover_held(job_id, index)
        finally:
            await self.store.release_lease(f"{job_id}:{index}", self.owner)

    async def _recover_held(self, job_id: str, index: int) -> int:
        rec = await self.store.get(job_id)
        if rec.final or await self.store.has_result(job_id, index):
            return 0
        sub = self.dispatcher.subrequests(rec)[index]
        attempts = await self.store.attempts(job_id, index)
        if attempts >= self.settings.max_attempts:
            await self.store.dead_letter(sub, dead_lettered(sub, attempts, worker="janitor"),
                                         attempts=attempts, keep=self.settings.dead_letter_max)
            metrics.DEAD_LETTERED.inc()
            log.warning("dead-lettered %s:%d after %d attempts", job_id, index, attempts)
            return 1
        log.warning("lease of %s:%d expired (%d attempt(s) used); sending it again",
                    job_id, index, attempts)
        await self._resend(sub, attempts, rec.meta.priority)
        metrics.SUBREQUESTS_RESENT.labels("lease_expired").inc()
        return 1

    async def _resend_orphan(self, orphan: Orphan) -> int:
        if not await self.store.claim_lost(orphan.model, orphan.member, orphan.sent):
            return 0  # sent again, or leased, since it was found
        job_id, index = names.split_member(orphan.member)
        rec = await self.store.get(job_id)
        if rec.final:
            return 0
        sub = self.dispatcher.subrequests(rec)[int(index)]
        log.warning("%s was sent but is in no queue and held by no worker; sending it again",
                    orphan.member)
        await self._resend(sub, await self.store.attempts(job_id, sub.index),
                           rec.meta.priority, marked=True)
        metrics.SUBREQUESTS_RESENT.labels("lost").inc()
        return 1

    async def _resend(self, sub: SubRequest, attempts: int, priority: int,
                      marked: bool = False) -> None:
        """Send again; one that was on the device when its worker was lost runs alone."""
        sub.isolated = attempts > 0
        if not marked:
            await self.store.mark_sent(sub.model, [sub.member])
        await self.dispatcher.send([sub], priority)

    async def _redispatch(self, job_id: str) -> int:
        rec = await self.store.get(job_id)
        if rec.final:
            await self.store.mark_dispatched(job_id)
            return 0
        done = await self.store.results(job_id)
        subs = [s for s in self.dispatcher.subrequests(rec) if s.index not in done]
        await self.store.mark_sent(rec.model, [s.member for s in subs])
        await self.dispatcher.send(subs, rec.meta.priority)
        await self.store.mark_dispatched(job_id)
        metrics.SUBREQUESTS_RESENT.labels("dispatch_interrupted").inc(len(subs))
        return len(subs)

    async def _expire(self, job_id: str) -> int:
        try:
            n = int(await self.lifecycle.expire(job_id))
        except JobNotFound:
            n = 0
        await self.store.deadline_done(job_id)  # final now, or already: nothing more to watch
        return n
