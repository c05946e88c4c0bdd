"""Liveness and readiness."""

import asyncio

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse

from services.api.supervisor import stopped
from shared.settings import get_settings
from shared.workers import live_workers

router = APIRouter(tags=["health"])

# Commands ride out a Redis outage by retrying (shared/redis_client.py); readiness must not:
# a probe wants an answer now, and "not ready" is the right one while Redis is away.
READY_REDIS_SECONDS = 2.0


@router.get("/healthz")
async def healthz() -> dict:
    return {"status": "ok"}


@router.get("/readyz", responses={503: {
    "description": "Not ready: draining, a background loop restarting, Redis or the blob "
                   "store unreachable, or no live worker",
    "content": {"application/json": {"example": {"status": "unready",
                                                 "reason": "no live worker", "workers": 0}}},
}})
async def readyz(request: Request) -> JSONResponse:
    """200 when this replica should get traffic: not draining (SIGTERM seen, see
    services/api/serve.py), its background loops running, Redis and the blob store answer
    (the store's ping lets go after 2 s here, whatever its own timeouts), and a worker is live
    unless FIBERMILL_READY_REQUIRES_WORKERS is off (workers that scale to zero)."""
    if getattr(request.app.state, "draining", False):
        return JSONResponse({"status": "draining", "reason": "shutting down"}, status_code=503)
    if down := stopped(getattr(request.app.state, "loops", [])):
        reasons = "; ".join(f"{s.name}: {s.last_error}" for s in down)
        return JSONResponse({"status": "unready", "reason": f"restarting {reasons}"},
                            status_code=503)
    redis = request.app.state.redis
    try:
        async with asyncio.timeout(READY_REDIS_SECONDS):
            await redis.ping()
            workers = await live_workers(redis)
    except Exception as exc:  # any failure to reach Redis means not ready
        reason = str(exc) or f"no answer within {READY_REDIS_SECONDS:g}s"
        return JSONResponse({"status": "unready", "reason": f"redis: {reason}"},
                            status_code=503)
    try:
        async with asyncio.timeout(READY_REDIS_SECONDS):
            await request.app.state.blobs.ping()
    except Exception as exc:  # unreachable, refusing, or no answer in time: not ready
        reason = str(exc) or f"no answer within {READY_REDIS_SECONDS:g}s"
        return JSONResponse({"status": "unready", "reason": f"blob store: {reason}"},
                            status_code=503)
    if not workers and get_settings().ready_requires_workers:
        return JSONResponse({"status": "unready", "reason": "no live worker", "workers": 0},
                            status_code=503)
    return JSONResponse({"status": "ready", "workers": len(workers)})
