"""The model registry: which models exist, what task each serves, where it lives, its limits.

The registry is a YAML file (`FIBERMILL_MODEL_REGISTRY`) read by both the API (to validate and
route) and the workers (to load). Relative model paths are resolved against the file's folder.
A model's `path` is its folder, or a Hugging Face cache folder (`models--org--name`), or, with
`hf_cache`, a repo id in that cache (shared/model_files.py finds the files).
"""

from enum import StrEnum
from functools import lru_cache
from pathlib import Path
from typing import Literal

import yaml
from pydantic import BaseModel, Field, model_validator

from shared.errors import ModelNotFound, UnknownModel

Task = Literal["text-generation", "image-generation"]
# `auto`: bf16 on a GPU that has it, else fp16; float32 on the CPU
# (services/worker/pipelines/dtypes.py).
DType = Literal["auto", "float32", "float16", "bfloat16"]


class ModelKind(StrEnum):
    CAUSAL_LM = "causal-lm"
    STABLE_DIFFUSION = "stable-diffusion"
    STABLE_DIFFUSION_XL = "stable-diffusion-xl"
    CLASS_DDPM = "class-ddpm"


KIND_TASK: dict[ModelKind, Task] = {
    ModelKind.CAUSAL_LM: "text-generation",
    ModelKind.STABLE_DIFFUSION: "image-generation",
    ModelKind.STABLE_DIFFUSION_XL: "image-generation",
    ModelKind.CLASS_DDPM: "image-generation",
}


class Limits(BaseModel):
    max_prompts: int = Field(16, ge=1)
    max_prompt_chars: int = Field(4000, ge=1)
    # image
    max_images_per_prompt: int = Field(8, ge=1)
    max_steps: int = Field(100, ge=1)
    min_size: int = Field(8, ge=8)
    max_size: int = Field(1024, ge=8)
    # text
    max_new_tokens: int = Field(512, ge=1)
    max_stop_sequences: int = Field(8, ge=0)


class Defaults(BaseModel):
    steps: int = 30
    width: int = 512
    height: int = 512
    guidance_scale: float = 7.5
    max_new_tokens: int = 32


class ModelSpec(BaseModel):
    # Queue names are built from it, and kombu splits priority lists at ":".
    name: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")
    kind: ModelKind
    path: Path
    # A Hugging Face cache (the folder that holds `models--org--name`): `path` is then a repo
    # id in it, and `revision` the ref (refs/<revision>) or commit of its snapshot.
    hf_cache: Path | None = None
    revision: str = Field("main", pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
    dtype: DType = "auto"
    description: str = ""
    limits: Limits = Limits()
    defaults: Defaults = Defaults()
    # Class-conditional models: class index -> the words that select it in a prompt.
    classes: list[list[str]] = []
    max_batch: int = Field(8, ge=1)
    max_wait_ms: int = Field(5, ge=0)
    # Image models: an idle engine's partial batch waits this long past its newest item for
    # the next one (engine/batcher.py), within max_wait_ms; 0: it starts at once.
    linger_ms: int = Field(0, ge=0)
    # Image models: swap the networks' layers for batch-invariant ones, so that an image's bytes
    # are the same alone and batched (pipelines/batch_invariant.py has what it costs).
    batch_invariant: bool = False
    pool_sets: int = Field(2, ge=0)
    # Backpressure: sub-requests waiting in this model's queue past which submits get a 503.
    max_queue_depth: int | None = Field(None, ge=1)
    # Causal LMs that chat: a Jinja chat template in the Hugging Face format (`messages`,
    # `add_generation_prompt`), rendered by the API into the job's prompt.
    chat_template: str | None = None
    # Causal LMs: prompt plus new tokens at most; the model's own (its config.json) when None.
    max_context: int | None = Field(None, ge=2)
    # Causal LMs: bytes its KV-cache pool may take; None: the worker's `kv_cache_bytes`, else a
    # share of the GPU memory its weights left free (services/worker/engine/kv_budget.py).
    kv_cache_bytes: int | None = Field(None, ge=1)

    @property
    def task(self) -> Task:
        return KIND_TASK[self.kind]

    @model_validator(mode="after")
    def _classes_for_class_models(self) -> "ModelSpec":
        if self.kind == ModelKind.CLASS_DDPM and not self.classes:
            raise ValueError(f"model {self.name}: a class-ddpm model needs `classes`")
        if self.batch_invariant and self.task != "image-generation":
            # Text rows are equal alone and batched up to rounding only (docs/architecture.md).
            raise ValueError(f"model {self.name}: `batch_invariant` is for image models")
        if self.hf_cache is not None and (self.path.is_absolute()
                                          or len(self.path.parts) not in (1, 2)):
            raise ValueError(f"model {self.name}: with `hf_cache`, `path` is a repo id such "
                             f"as Qwen/Qwen2.5-0.5B-Instruct, not {str(self.path)!r}")
        return self


class ModelRegistry(BaseModel):
    models: dict[str, ModelSpec]

    def get(self, name: str) -> ModelSpec:
        try:
            return self.models[name]
        except KeyError:
            raise UnknownModel(name, sorted(self.models)) from None

    def find(self, name: str) -> ModelSpec:
        """As `get`, for a name in a path rather than a request's field (404, not 422)."""
        try:
            return self.models[name]
        except KeyError:
            raise ModelNotFound(name) from None

    @classmethod
    def load(cls, path: Path) -> "ModelRegistry":
        raw = yaml.safe_load(Path(path).read_text()) or {}
        base = Path(path).resolve().parent
        models = {}
        for name, spec in (raw.get("models") or {}).items():
            spec = {**spec, "name": name}
            if spec.get("hf_cache") is not None:  # `path` is a repo id, not a folder
                spec["hf_cache"] = base / Path(spec["hf_cache"])
            else:
                model_path = Path(spec.get("path", name))
                spec["path"] = model_path if model_path.is_absolute() else base / model_path
            models[name] = ModelSpec.model_validate(spec)
        return cls(models=models)


@lru_cache
def load_registry(path: Path) -> ModelRegistry:
    return ModelRegistry.load(path)
