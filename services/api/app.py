"""The FastAPI application: routes, plus the joiner and the janitor as background tasks."""

import asyncio
import contextlib
import os
import socket
import uuid
from collections.abc import AsyncIterator

import redis.asyncio as aioredis
from fastapi import FastAPI

from services.api import errors
from services.api.dispatch import Dispatcher
from services.api.janitor import Janitor
from services.api.joiner import Joiner
from services.api.routes import health, jobs, models
from shared.celery_config import make_celery
from shared.jobstore import JobStore
from shared.registry import load_registry
from shared.settings import Settings, get_settings


@contextlib.asynccontextmanager
async def lifespan(app: FastAPI) -> AsyncIterator[None]:
    settings: Settings = get_settings()
    redis = aioredis.Redis.from_url(settings.redis_url, health_check_interval=30)
    store = JobStore(redis, settings.finished_job_ttl_seconds)
    registry = load_registry(settings.model_registry)
    celery = make_celery(settings, name="fibermill-api")
    dispatcher = Dispatcher(celery, registry)
    consumer = f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:6]}"
    app.state.redis, app.state.store, app.state.registry = redis, store, registry
    app.state.dispatcher = dispatcher
    app.state.joiner = Joiner(redis, store, settings, consumer)
    app.state.janitor = Janitor(store, dispatcher, settings)
    tasks = [
        asyncio.create_task(app.state.joiner.run(), name="joiner"),
        asyncio.create_task(app.state.janitor.run(), name="janitor"),
    ]
    try:
        yield
    finally:
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await redis.aclose()
        celery.close()


def create_app() -> FastAPI:
    app = FastAPI(title="Fibermill", version="0.1.0", lifespan=lifespan)
    errors.install(app)
    app.include_router(jobs.router)
    app.include_router(models.router)
    app.include_router(health.router)
    return app


app = create_app()
