"""The API's Prometheus endpoint. Queue depths, the backlog and running leases are read from
Redis when scraped (one round trip); every replica reports the same figures for them, so
queries take `max` over replicas, not `sum`."""

from fastapi import APIRouter, Request, Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from services.api import metrics
from shared import names
from shared.celery_config import PRIORITY_STEPS
from shared.queue_depth import priority_lists

router = APIRouter(tags=["health"])


@router.get("/metrics")
async def prometheus(request: Request) -> Response:
    redis = request.app.state.redis
    models = list(request.app.state.registry.models)
    async with redis.pipeline(transaction=False) as pipe:
        for model in models:
            for key in priority_lists(model):
                pipe.llen(key)
            pipe.zcard(names.backlog_key(model))
        pipe.zcard(names.LEASES)
        counts = iter(await pipe.execute())
    for model in models:
        for priority in PRIORITY_STEPS:  # priority_lists() is in this order
            metrics.QUEUE_DEPTH.labels(model, str(priority)).set(next(counts))
        metrics.SUBREQUESTS_BACKLOG.labels(model).set(next(counts))
    metrics.SUBREQUESTS_RUNNING.set(next(counts))
    return Response(generate_latest(), media_type=CONTENT_TYPE_LATEST)
