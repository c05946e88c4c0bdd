"""The API's Prometheus endpoint."""

from fastapi import APIRouter, Request, Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from services.api import metrics
from shared import names
from shared.queue_depth import queue_depth

router = APIRouter(tags=["health"])


@router.get("/metrics")
async def prometheus(request: Request) -> Response:
    redis = request.app.state.redis
    for model in request.app.state.registry.models:
        metrics.QUEUE_DEPTH.labels(model).set(await queue_depth(redis, model))
    metrics.SUBREQUESTS_RUNNING.set(await redis.zcard(names.LEASES))
    return Response(generate_latest(), media_type=CONTENT_TYPE_LATEST)
