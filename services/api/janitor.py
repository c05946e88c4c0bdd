"""The janitor: recovers sub-requests whose worker died, without waiting for the broker.

A running sub-request holds a lease its worker renews on every heartbeat. When a lease
expires, the janitor takes it (atomically, so one API replica acts) and sends the sub-request
again, or dead-letters it once it has used up its attempts. It also re-sends jobs whose
creating API process died before it finished dispatching them, and fails jobs past their
deadline.
"""

import asyncio
import logging

from services.api import metrics
from services.api.dispatch import Dispatcher
from services.api.lifecycle import Lifecycle
from shared.asyncio_compat import raise_if_cancelled
from shared.errors import JobNotFound
from shared.failures import dead_lettered
from shared.jobstore import JobStore
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

    async def run(self) -> None:
        while True:
            raise_if_cancelled()
            try:
                await self.sweep()
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("janitor sweep failed")
            await asyncio.sleep(self.settings.janitor_interval_seconds)

    async def sweep(self) -> int:
        n = 0
        for job_id, index in await self.store.claim_expired_leases():
            try:
                n += await self._recover(job_id, index)
            except JobNotFound:
                continue
        for job_id in await self.store.claim_stale_dispatches(STALE_DISPATCH_SECONDS):
            try:
                n += await self._redispatch(job_id)
            except JobNotFound:
                continue
        for job_id in await self.store.claim_due_deadlines():
            try:
                n += await self.lifecycle.expire(job_id)
            except JobNotFound:
                continue
        return n

    async def _recover(self, job_id: str, index: int) -> int:
        rec = await self.store.get(job_id)
        if rec.final or await self.store.has_result(job_id, index):
            return 0
        sub = self.dispatcher.subrequests(rec)[index]
        attempts = await self.store.attempts(job_id, index)
        if attempts >= self.settings.max_attempts:
            await self.store.dead_letter(sub, dead_lettered(sub, attempts, worker="janitor"))
            metrics.DEAD_LETTERED.inc()
            log.warning("dead-lettered %s:%d after %d attempts", job_id, index, attempts)
            return 1
        log.warning(
            "lease of %s:%d expired (attempt %d); sending it again", job_id, index, attempts
        )
        await self.dispatcher.send([sub], rec.meta.priority)
        metrics.SUBREQUESTS_RESENT.labels("lease_expired").inc()
        return 1

    async def _redispatch(self, job_id: str) -> int:
        rec = await self.store.get(job_id)
        if rec.final:
            return 0
        done = await self.store.results(job_id)
        subs = [s for s in self.dispatcher.subrequests(rec) if s.index not in done]
        await self.dispatcher.send(subs, rec.meta.priority)
        metrics.SUBREQUESTS_RESENT.labels("dispatch_interrupted").inc(len(subs))
        return len(subs)
