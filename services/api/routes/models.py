"""/v1/models: the registry, each model's own parameters, and which live workers serve it.
Both APIs read it: its answers, and its errors (services/api/openai/errors.py), carry
Fibermill's fields and OpenAI's at once."""

from fastapi import APIRouter, Depends, Request

from services.api.auth import authenticate
from services.api.deps import RegistryDep
from services.api.model_info import ModelInfo, ModelList, describe
from services.api.openai.errors import shared_errors
from shared.workers import live_workers

router = APIRouter(prefix="/v1/models", tags=["models"], dependencies=[Depends(authenticate)])


@router.get("", response_model=ModelList, responses=shared_errors(401))
async def list_models(registry: RegistryDep, request: Request) -> ModelList:
    """Every model this deployment knows, with the parameters each one takes."""
    workers = await live_workers(request.app.state.redis)
    models = [describe(registry.models[name], workers) for name in sorted(registry.models)]
    return ModelList(data=models, models=models)


@router.get("/{model}", response_model=ModelInfo, responses=shared_errors(401, 404))
async def get_model(model: str, registry: RegistryDep, request: Request) -> ModelInfo:
    """One model (OpenAI's "retrieve model", with Fibermill's details)."""
    spec = registry.find(model)
    return describe(spec, await live_workers(request.app.state.redis))
