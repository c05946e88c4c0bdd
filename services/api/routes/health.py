"""Liveness, readiness and the Prometheus endpoint."""

from fastapi import APIRouter, Request, Response
from fastapi.responses import JSONResponse
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from services.api import metrics
from shared import names
from shared.queue_depth import queue_depth
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


@router.get("/metrics")
async def prometheus(request: Request) -> Response:
    redis = request.app.state.redis
    for model in request.app.state.registry.models:
        metrics.QUEUE_DEPTH.labels(model).set(await queue_depth(redis, model))
    metrics.SUBREQUESTS_RUNNING.set(await redis.zcard(names.LEASES))
    return Response(generate_latest(), media_type=CONTENT_TYPE_LATEST)
