"""What GET /v1/models says of each model: its task, its own parameters with their ranges and
defaults, and which live workers serve it."""

from typing import Any, Literal

from pydantic import BaseModel, Field

from services.api import parameters
from shared.messages import WorkerHeartbeat
from shared.model_files import chat_template, context_length, visible_folder
from shared.registry import ModelSpec, Task


class ModelWorker(BaseModel):
    id: str = Field(description="The worker process (host and device)")
    device: str = Field(description="The device it runs the model on, such as cuda:0 or cpu")
    in_flight: int = Field(description="Sub-requests it holds now, of any model")


class ModelInfo(BaseModel):
    # OpenAI's model object (GET /v1/models answers both APIs):
    id: str = Field(description="The model's name (OpenAI's field)")
    object: Literal["model"] = Field("model", description="Always model (OpenAI's field)")
    created: int = Field(description="When the model's files were last written (Unix time; 0 "
                         "when the API cannot see them)")
    owned_by: str = Field("fibermill", description="Always fibermill (OpenAI's field)")
    name: str = Field(description="The value of a job's `model` field")
    task: Task = Field(description="What the model does; a job's `task` may be left out")
    kind: str = Field(description="The model family, which decides how it is run")
    description: str = Field(description="What the model is, in a sentence")
    parameters: dict[str, dict[str, Any]] = Field(description=(
        "JSON Schema of each `input` field this model takes, with the model's own bounds "
        "(minimum, maximum, maxItems) and defaults"))
    defaults: dict[str, Any] = Field(description="Values used for fields left out")
    limits: dict[str, Any] = Field(description="The model's limits, as the registry sets them")
    classes: list[list[str]] | None = Field(description=(
        "Class-conditional models: the words that select each class in a prompt"))
    workers: list[ModelWorker] = Field(description="Live workers that serve the model")
    available: bool = Field(description="Whether at least one live worker serves it now")
    chat: bool = Field(description="Whether it has a chat template (the registry's or its "
                       "tokenizer's): /v1/chat/completions takes it (text models; "
                       "/v1/completions takes every one)")
    context_length: int | None = Field(description=(
        "Text models: the most tokens a prompt and its completion (max_new_tokens, OpenAI's "
        "max_tokens) may come to; a request past it is refused, never cut. Null for image "
        "models, and where the API cannot read the model's files"))


class ModelList(BaseModel):
    object: Literal["list"] = Field("list", description="Always list (OpenAI's field)")
    data: list[ModelInfo] = Field(description="By name (OpenAI's field)")
    models: list[ModelInfo] = Field(description="By name; the same list as `data`")


def describe(spec: ModelSpec, workers: list[WorkerHeartbeat]) -> ModelInfo:
    serving = [w for w in workers if spec.name in w.models]
    return ModelInfo(
        id=spec.name, created=_created(spec), chat=chat_template(spec) is not None,
        context_length=context_length(spec),
        name=spec.name, task=spec.task, kind=spec.kind, description=spec.description,
        parameters=parameters.parameters(spec), defaults=parameters.defaults(spec),
        limits=parameters.limits(spec), classes=spec.classes or None,
        workers=[ModelWorker(id=w.id, device=w.device, in_flight=w.in_flight) for w in serving],
        available=bool(serving),
    )


def _created(spec: ModelSpec) -> int:
    folder = visible_folder(spec)  # an API replica need not hold the model files
    return 0 if folder is None else int(folder.stat().st_mtime)
