"""Graceful drain at SIGTERM: finish what the worker holds, or hand it back, then exit.

Celery's warm shutdown (SIGTERM) stops consuming and waits for the running tasks; messages
the worker took but never acknowledged go back to the queue when its channel closes (kombu's
Redis QoS restores them). Only then does `worker_shutdown` stop the runtime, so the event
loop, the heartbeat (lease renewal) and the cancel listener keep running through the drain.

What Celery cannot bound, this module does: `FIBERMILL_DRAIN_SECONDS` after the SIGTERM, every
sub-request still held is asked to stop ("drain") and, once it has, handed back:

1. `JobStore.hand_back_lease` (one atomic step, only if this worker still owns the lease): the
   lease's expiry goes to 0 (expired for every clock) and its owner to `<worker>#handback`, so
   the heartbeat can no longer renew it and a new delivery can take it at once; the attempt it
   used is given back (a drain is not a lost worker, so it never counts towards
   `FIBERMILL_MAX_ATTEMPTS`).
2. The sub-request is sent to its queue again with its job's priority.
3. The lease is released.

A crash between 1 and 3 leaves an expired lease, which the janitor re-sends; one between 2
and 3 can send it twice, and the second delivery finds it running or done. Either way nothing
is lost and nothing runs twice in parallel. A sub-request that does not stop within
`DRAIN_STOP_GRACE_SECONDS` is handed to the janitor (steps 1 only) and the process exits.
"""

import asyncio
import logging
import os
import time

from shared.errors import JobNotFound
from shared.sending import send_subrequests
from shared.subrequest import SubRequest

log = logging.getLogger(__name__)

# After the drain deadline, how long stopped sub-requests get to reach a step boundary.
DRAIN_STOP_GRACE_SECONDS = 5.0
FORCED_EXIT_CODE = 75  # EX_TEMPFAIL: a sub-request ignored its stop; the janitor re-sends it

def handback_owner(worker_id: str) -> str:
    return f"{worker_id}#handback"


async def expire_lease(rt, sub: SubRequest) -> bool:
    """Step 1: give up the lease so any delivery (or the janitor) can take it at once."""
    return await rt.store.hand_back_lease(sub, rt.id, handback_owner(rt.id))


async def hand_back(rt, sub: SubRequest) -> str:
    """Give a stopped sub-request back to its queue. Returns what happened to it."""
    if not await expire_lease(rt, sub):
        return "lost_lease"  # the janitor took it already and re-sends it
    try:
        rec = await rt.store.get(sub.job_id)
    except JobNotFound:
        rec = None
    if rec is not None and not rec.final:
        if rt.celery is None:
            return "janitor"  # no broker client here: the expired lease is re-sent
        try:
            await send_subrequests(rt.celery, [sub.model_copy()], rec.meta.priority)
        except Exception:
            log.exception("could not send %s back to its queue; the janitor will", sub.member)
            return "janitor"
    await rt.store.release_lease(sub.member, handback_owner(rt.id))
    return "sent" if rec is not None and not rec.final else "final"


async def drain_watch(rt, deadline: float) -> None:
    """At the drain deadline (time.monotonic), stop what is still held; exit if it will not."""
    await asyncio.sleep(max(0.0, deadline - time.monotonic()))
    rt.drain_expired = True
    flights = list(rt.in_flight.values())
    if flights:
        log.warning("drain deadline passed: stopping %d sub-request(s) to hand them back",
                    len(flights))
    for flight in flights:
        flight.request_stop("drain")
    end = time.monotonic() + DRAIN_STOP_GRACE_SECONDS
    while time.monotonic() < end:
        if not rt.in_flight:
            return
        for flight in list(rt.in_flight.values()):  # one that arrived after the deadline
            flight.request_stop("drain")
        await asyncio.sleep(0.05)
    stuck = list(rt.in_flight.values())
    for flight in stuck:
        rt.in_flight.pop(flight.sub.member, None)  # no more renewals
        try:
            await expire_lease(rt, flight.sub)
        except Exception:  # Redis away: the lease simply expires
            log.exception("could not expire the lease of %s", flight.sub.member)
    log.critical("%d sub-request(s) did not stop within %.0fs of the drain deadline; exiting, "
                 "the janitor re-sends them", len(stuck), DRAIN_STOP_GRACE_SECONDS)
    os._exit(FORCED_EXIT_CODE)
