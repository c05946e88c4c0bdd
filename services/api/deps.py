"""Dependency aliases the routes use, so each route stays a few lines."""

from typing import Annotated

from fastapi import Depends, Request

from services.api.dispatch import Dispatcher
from shared.jobstore import JobRecord, JobStore
from shared.registry import ModelRegistry
from shared.settings import Settings, get_settings

SettingsDep = Annotated[Settings, Depends(get_settings)]


def _store(request: Request) -> JobStore:
    return request.app.state.store


def _registry(request: Request) -> ModelRegistry:
    return request.app.state.registry


def _dispatcher(request: Request) -> Dispatcher:
    return request.app.state.dispatcher


JobStoreDep = Annotated[JobStore, Depends(_store)]
RegistryDep = Annotated[ModelRegistry, Depends(_registry)]
DispatcherDep = Annotated[Dispatcher, Depends(_dispatcher)]


async def _job(job_id: str, store: JobStoreDep) -> JobRecord:
    return await store.get(job_id)  # JobNotFound becomes a 404 in services/api/errors.py


JobDep = Annotated[JobRecord, Depends(_job)]
