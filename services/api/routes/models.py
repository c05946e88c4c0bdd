"""/v1/models: the registry, and which live workers serve each model."""

from fastapi import APIRouter, Depends, Request

from services.api.auth import authenticate
from services.api.deps import RegistryDep
from shared.workers import live_workers

router = APIRouter(prefix="/v1/models", tags=["models"], dependencies=[Depends(authenticate)])


@router.get("")
async def list_models(registry: RegistryDep, request: Request) -> dict:
    workers = await live_workers(request.app.state.redis)
    out = []
    for name, spec in sorted(registry.models.items()):
        serving = [w for w in workers if name in w.models]
        out.append(
            {
                "name": name,
                "task": spec.task,
                "kind": spec.kind,
                "description": spec.description,
                "defaults": spec.defaults.model_dump(),
                "limits": spec.limits.model_dump(),
                "classes": spec.classes or None,
                "workers": [
                    {"id": w.id, "device": w.device, "in_flight": w.in_flight} for w in serving
                ],
                "available": bool(serving),
            }
        )
    return {"models": out}
