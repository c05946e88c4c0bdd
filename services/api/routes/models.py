"""/v1/models: the registry, each model's own parameters, and which live workers serve it."""

from fastapi import APIRouter, Depends, Request

from services.api.auth import authenticate
from services.api.deps import RegistryDep
from services.api.model_info import ModelInfo, ModelList, describe
from services.api.openapi import errors
from shared.workers import live_workers

router = APIRouter(prefix="/v1/models", tags=["models"], dependencies=[Depends(authenticate)])


@router.get("", response_model=ModelList, responses=errors(401))
async def list_models(registry: RegistryDep, request: Request) -> ModelList:
    """Every model this deployment knows, with the parameters each one takes."""
    workers = await live_workers(request.app.state.redis)
    models = [describe(registry.models[name], workers) for name in sorted(registry.models)]
    return ModelList(data=models, models=models)


@router.get("/{model}", response_model=ModelInfo, responses=errors(401, 404))
async def get_model(model: str, registry: RegistryDep, request: Request) -> ModelInfo:
    """One model (OpenAI's "retrieve model", with Fibermill's details)."""
    spec = registry.find(model)
    return describe(spec, await live_workers(request.app.state.redis))
