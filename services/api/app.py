"""The FastAPI application: routes, plus the joiner, the janitor, the webhook sender and the
live-event hub as background tasks that every replica runs."""

import asyncio
import contextlib
import inspect
import os
import socket
import uuid
from collections.abc import AsyncIterator
from typing import Any

from fastapi import FastAPI

from services.api import errors, openapi, shutdown
from services.api.batches.driver import batch_driver
from services.api.body_limit import BodyLimitMiddleware
from services.api.dispatch import Dispatcher
from services.api.events import EventHub
from services.api.http_metrics import HttpMetricsMiddleware
from services.api.janitor import Janitor
from services.api.joiner import Joiner
from services.api.lifecycle import Lifecycle
from services.api.notify import Notifier
from services.api.ratelimit import RateLimiter
from services.api.routes import docs, health, jobs, models, openai, ui, usage
from services.api.routes import metrics as metrics_route
from services.api.routes.batches import router as batches_router
from services.api.routes.files import router as files_router
from services.api.routes.webhook_secrets import router as webhook_secrets_router
from services.api.server_spans import ServerSpans, excluded_paths
from services.api.submission import Submissions
from services.api.supervisor import Supervised
from services.api.sweeper import Sweeper
from services.api.watchers import Watchers
from services.api.webhooks.outbox import Outbox
from shared import tracing
from shared.blobstore.factory import open_store
from shared.celery_config import make_celery
from shared.jobstore import JobStore
from shared.redis_client import connect
from shared.registry import load_registry
from shared.settings import get_settings

DESCRIPTION = """Submit text and image generation jobs, follow them, fetch their outputs.

A job holds one or many prompts; each becomes its own sub-request, batched with others on a
worker, and the job's outputs come back in the order of its prompts. Submit with
`POST /v1/jobs` (add `Prefer: wait=30` to get the finished job in the answer), then poll
`GET /v1/jobs/{id}`, stream `GET /v1/jobs/{id}/events`, or receive a signed webhook.
`GET /v1/models` lists each model's parameters with their ranges and defaults.

When the deployment has API keys, send one as `Authorization: Bearer <key>`."""


@contextlib.asynccontextmanager
async def lifespan(app: FastAPI) -> AsyncIterator[None]:
    settings = get_settings()
    redis = connect(settings, health_check_interval=30)
    store = JobStore(redis, settings.finished_job_ttl_seconds)
    blobs = open_store(settings)
    registry = load_registry(settings.model_registry)
    celery = make_celery(settings, name="fibermill-api")
    dispatcher = Dispatcher(celery, registry)
    consumer = f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:6]}"
    outbox = Outbox(redis, store, settings, consumer)
    hub = EventHub(redis)
    notifier = Notifier(redis, outbox, settings.public_url, hub)
    lifecycle = Lifecycle(store, notifier, settings.public_url)
    s = app.state
    s.redis, s.store, s.registry, s.dispatcher = redis, store, registry, dispatcher
    s.blobs = blobs
    s.submissions = Submissions(redis, store, registry, dispatcher, settings)
    s.outbox, s.lifecycle = outbox, lifecycle
    s.limiter = RateLimiter(settings)
    s.hub = hub
    s.watchers = Watchers(settings.max_watches, settings.max_watches_per_caller)
    s.joiner = Joiner(redis, lifecycle, settings, consumer)
    s.janitor = Janitor(store, dispatcher, lifecycle, settings)
    s.loops = [Supervised("joiner", s.joiner.run), Supervised("janitor", s.janitor.run),
               Supervised("webhooks", outbox.run), Supervised("events", s.hub.run),
               Supervised("sweeper", Sweeper(blobs, settings, redis).run)]
    s.loops.append(Supervised("batches", batch_driver(s, settings, consumer).run))
    tasks = [asyncio.create_task(loop.run(), name=loop.name) for loop in s.loops]
    try:
        yield
    finally:
        await shutdown.stop_tasks(tasks)
        await shutdown.bounded("closing Redis", redis.aclose())
        await shutdown.bounded("closing the blob store", blobs.close())
        await shutdown.bounded("closing Celery", asyncio.to_thread(celery.close))


def _no_native_telemetry() -> dict[str, Any]:
    """FastAPI's own telemetry off, where this FastAPI has it (`FastAPI(telemetry=...)`): it
    starts as soon as an SDK is installed, and besides a second server span it makes one for
    each dependency resolved, the endpoint and the serialization, which made a traced job's
    POST cost twice the CPU. The server span comes from `ServerSpans`, once."""
    if "telemetry" not in inspect.signature(FastAPI.__init__).parameters:
        return {}
    return {"telemetry": {"tracing": False, "metrics": False, "logs": False,
                          "operation_spans": False}}


def create_app() -> FastAPI:
    # docs_url/redoc_url off: routes/docs.py serves both pages with local assets.
    app = FastAPI(title="Fibermill", version="0.1.0", description=DESCRIPTION,
                  lifespan=lifespan, docs_url=None, redoc_url=None, **_no_native_telemetry())
    app.add_middleware(BodyLimitMiddleware, max_bytes=get_settings().max_body_bytes)
    app.add_middleware(HttpMetricsMiddleware)  # outermost: counts 413s and 500s too
    errors.install(app)
    if tracing.setup("fibermill-api") and tracing.instrumenting("fastapi"):
        app.add_middleware(ServerSpans, excluded=excluded_paths())  # outermost
    app.include_router(jobs.router)
    app.include_router(models.router)
    app.include_router(usage.router)
    app.include_router(openai.router)
    app.include_router(files_router)
    app.include_router(batches_router)
    app.include_router(webhook_secrets_router)
    app.include_router(health.router)
    app.include_router(metrics_route.router)
    app.include_router(ui.router)
    app.include_router(docs.router)
    openapi.install(app)
    return app


app = create_app()
