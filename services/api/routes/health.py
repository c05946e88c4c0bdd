"""Liveness and readiness.

`/readyz` is unauthenticated (probes carry no key), so a failure names only the dependency that
is down; what went wrong (an address, a bucket, an exception) goes to the log."""

import asyncio
import logging

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse

from services.api.supervisor import stopped
from shared.settings import get_settings
from shared.workers import live_workers

log = logging.getLogger(__name__)

router = APIRouter(tags=["health"])

# Commands ride out a Redis outage by retrying (shared/redis_client.py); readiness must not:
# a probe wants an answer now, and "not ready" is the right one while Redis is away.
READY_REDIS_SECONDS = 2.0


@router.get("/healthz")
async def healthz() -> dict:
    return {"status": "ok"}


UNAVAILABLE = "unavailable"


def _unready(reason: str, **down: object) -> JSONResponse:
    return JSONResponse({"status": "unready", "reason": reason, **down}, status_code=503)


def _detail(exc: Exception) -> str:
    said = str(exc) or f"no answer within {READY_REDIS_SECONDS:g}s"
    return f"{type(exc).__name__}: {said}"


@router.get("/readyz", responses={503: {
    "description": "Not ready: draining, a background loop restarting, Redis or the blob "
                   "store unreachable, or no live worker. Only the part that is down is "
                   'named (`"redis"`, `"blob_store"`: `"unavailable"`; `"loops"`; '
                   '`"workers": 0`); the cause is in the API\'s log',
    "content": {"application/json": {"example": {"status": "unready",
                                                 "reason": "redis unavailable",
                                                 "redis": UNAVAILABLE}}},
}})
async def readyz(request: Request) -> JSONResponse:
    """200 when this replica should get traffic: not draining (SIGTERM seen, see
    services/api/serve.py), its background loops running, Redis and the blob store answer
    (the store's ping lets go after 2 s here, whatever its own timeouts), and a worker is live
    unless FIBERMILL_READY_REQUIRES_WORKERS is off (workers that scale to zero)."""
    if getattr(request.app.state, "draining", False):
        return JSONResponse({"status": "draining", "reason": "shutting down"}, status_code=503)
    if down := stopped(getattr(request.app.state, "loops", [])):
        # The supervisor logs each loop's error as it restarts it.
        loops = [s.name for s in down]
        return _unready(f"restarting {', '.join(loops)}", loops={n: "restarting" for n in loops})
    redis = request.app.state.redis
    try:
        async with asyncio.timeout(READY_REDIS_SECONDS):
            await redis.ping()
            workers = await live_workers(redis)
    except Exception as exc:  # any failure to reach Redis means not ready
        log.warning("not ready: redis: %s", _detail(exc))
        return _unready("redis unavailable", redis=UNAVAILABLE)
    try:
        async with asyncio.timeout(READY_REDIS_SECONDS):
            await request.app.state.blobs.ping()
    except Exception as exc:  # unreachable, refusing, or no answer in time: not ready
        log.warning("not ready: blob store: %s", _detail(exc))
        return _unready("blob store unavailable", blob_store=UNAVAILABLE)
    if not workers and get_settings().ready_requires_workers:
        return _unready("no live worker", workers=0)
    return JSONResponse({"status": "ready", "workers": len(workers)})
