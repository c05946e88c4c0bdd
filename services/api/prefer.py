"""RFC 7240 `Prefer: wait=N` on a job's creation and on its GET (a long poll): answer once
the job is final, or after N seconds (capped by `FIBERMILL_MAX_WAIT_SECONDS`), whichever comes
first."""

import re
from dataclasses import dataclass

from fastapi import Response

from services.api.events import EventHub, wait_final
from services.api.watchers import Watchers
from shared.jobstore import JobRecord, JobStore

_PREFER_WAIT = re.compile(r"(?:^|[;,\s])wait=(\d+)")


def prefer_wait(prefer: str | None, limit: int) -> int | None:
    """The seconds a `Prefer` header asks to wait, capped at the server's limit."""
    m = _PREFER_WAIT.search(prefer or "")
    if m is None:
        return None
    digits = m.group(1)
    # Past nine digits it is above any limit; int() of thousands of digits raises.
    return limit if len(digits) > 9 else min(int(digits), limit)


@dataclass
class PreferWait:
    """What `Prefer: wait` asked of a create or a GET: the job once final, or after
    `seconds`."""

    seconds: int | None
    hub: EventHub
    store: JobStore
    watchers: Watchers
    caller: str

    async def apply(self, rec: JobRecord, response: Response) -> JobRecord:
        """`rec` is the job as just created (or found by its Idempotency-Key), or as a GET
        loaded it."""
        if self.seconds is None or self.watchers.refusal(self.caller) is not None:
            return rec  # past the replica's bound on waits: answered at once, not refused
        response.headers["Preference-Applied"] = f"wait={self.seconds}"
        if rec.final:
            return rec
        with self.watchers.hold(self.caller, checked=True):
            return await wait_final(self.hub, self.store, rec.id, self.seconds, rec)
