"""Liveness and readiness."""

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse

from shared.workers import live_workers

router = APIRouter(tags=["health"])


@router.get("/healthz")
async def healthz() -> dict:
    return {"status": "ok"}


@router.get("/readyz")
async def readyz(request: Request) -> JSONResponse:
    redis = request.app.state.redis
    try:
        await redis.ping()
        workers = await live_workers(redis)
    except Exception as exc:  # any failure to reach Redis means not ready
        return JSONResponse({"status": "unready", "reason": f"redis: {exc}"}, status_code=503)
    if not workers:
        return JSONResponse({"status": "unready", "reason": "no live worker"}, status_code=503)
    return JSONResponse({"status": "ready", "workers": len(workers)})
