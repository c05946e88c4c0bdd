"""RFC 7240 `Prefer: wait=N` on job creation: answer once the job is final, or after N
seconds (capped by `FIBERMILL_MAX_WAIT_SECONDS`), whichever comes first."""

import re
from dataclasses import dataclass

import redis.asyncio as aioredis
from fastapi import Response

from services.api.events import wait_final
from shared.jobstore import JobRecord, JobStore

_PREFER_WAIT = re.compile(r"(?:^|[;,\s])wait=(\d+)")


def prefer_wait(prefer: str | None, limit: int) -> int | None:
    """The seconds a `Prefer` header asks to wait, capped at the server's limit."""
    m = _PREFER_WAIT.search(prefer or "")
    return min(int(m.group(1)), limit) if m else None


@dataclass
class PreferWait:
    """What `Prefer: wait` asked of a create: the job once final, or after `seconds`."""

    seconds: int | None
    redis: aioredis.Redis
    store: JobStore

    async def apply(self, rec: JobRecord, response: Response) -> JobRecord:
        if self.seconds is None:
            return rec
        response.headers["Preference-Applied"] = f"wait={self.seconds}"
        return await wait_final(self.redis, self.store, rec.id, self.seconds)
