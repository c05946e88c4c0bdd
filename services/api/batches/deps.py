"""The file and batch stores as route dependencies, made once per app from what the app's
lifespan opened (its Redis and blob store)."""

from typing import Annotated

from fastapi import Depends, Request
from starlette.datastructures import State

from services.api.batches.files import FileStore
from services.api.batches.store import BatchStore
from shared.settings import Settings, get_settings


def file_store(state: State, settings: Settings) -> FileStore:
    if getattr(state, "files", None) is None or state.files.redis is not state.redis:
        state.files = FileStore(state.redis, state.blobs, settings.file_ttl_seconds)
    return state.files


def batch_store(state: State, settings: Settings) -> BatchStore:
    if getattr(state, "batches", None) is None or state.batches.redis is not state.redis:
        state.batches = BatchStore(state.redis, settings.file_ttl_seconds)
    return state.batches


async def _files(request: Request) -> FileStore:
    return file_store(request.app.state, get_settings())


async def _batches(request: Request) -> BatchStore:
    return batch_store(request.app.state, get_settings())


FilesDep = Annotated[FileStore, Depends(_files)]
BatchesDep = Annotated[BatchStore, Depends(_batches)]
