"""Per-task job inputs and outputs (the external contract), with checks against a model's limits."""

from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field, StringConstraints, field_validator

from shared.class_prompts import resolve_class
from shared.errors import InvalidInput
from shared.messages import GeneratedImage, GeneratedText
from shared.registry import ModelKind, ModelSpec

Prompt = Annotated[str, StringConstraints(min_length=1)]
Seed = Annotated[int, Field(ge=0, le=2**31 - 1)]


# Bounds of fields whose values reach the model as numbers: an unbounded one is a way to fail
# every request batched with it.
MAX_TOP_K = 1000
MAX_STOP_CHARS = 256


class _Input(BaseModel):
    # NaN and Infinity are refused everywhere: no bound catches NaN.
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    prompts: list[Prompt] = Field(min_length=1)
    seed: Seed | None = None

    def _check_prompts(self, spec: ModelSpec) -> None:
        limits = spec.limits
        if len(self.prompts) > limits.max_prompts:
            raise InvalidInput(
                "input.prompts",
                f"{len(self.prompts)} prompts; model {spec.name} takes at most "
                f"{limits.max_prompts}",
            )
        for i, p in enumerate(self.prompts):
            if len(p) > limits.max_prompt_chars:
                raise InvalidInput(
                    f"input.prompts.{i}", f"longer than {limits.max_prompt_chars} characters"
                )


class TextGenerationInput(_Input):
    max_new_tokens: int | None = Field(None, ge=1)
    temperature: float = Field(0.0, ge=0.0, le=5.0, description="0 means greedy decoding")
    top_p: float = Field(1.0, gt=0.0, le=1.0)
    top_k: int = Field(0, ge=0, le=MAX_TOP_K, description="0 disables top-k filtering")
    stop: list[Annotated[str, StringConstraints(min_length=1, max_length=MAX_STOP_CHARS)]] = []

    def check_limits(self, spec: ModelSpec) -> None:
        if spec.task != "text-generation":
            raise InvalidInput("task", f"model {spec.name} serves {spec.task}")
        self._check_prompts(spec)
        limits = spec.limits
        if self.max_new_tokens is not None and self.max_new_tokens > limits.max_new_tokens:
            raise InvalidInput(
                "input.max_new_tokens",
                f"{self.max_new_tokens} is above model {spec.name}'s limit of "
                f"{limits.max_new_tokens}",
            )
        if len(self.stop) > limits.max_stop_sequences:
            raise InvalidInput("input.stop", f"at most {limits.max_stop_sequences} stop sequences")


class ImageGenerationInput(_Input):
    negative_prompt: str = ""
    num_images_per_prompt: int = Field(1, ge=1)
    width: int | None = Field(None, ge=8)
    height: int | None = Field(None, ge=8)
    steps: int | None = Field(None, ge=1)
    guidance_scale: float | None = Field(None, ge=0.0, le=50.0)

    @field_validator("width", "height")
    @classmethod
    def _multiple_of_8(cls, v: int | None) -> int | None:
        # Latent diffusion downsamples by 8: other sizes cannot be decoded back exactly.
        if v is not None and v % 8:
            raise ValueError(f"must be a multiple of 8, got {v}")
        return v

    def check_limits(self, spec: ModelSpec) -> None:
        if spec.task != "image-generation":
            raise InvalidInput("task", f"model {spec.name} serves {spec.task}")
        self._check_prompts(spec)
        limits = spec.limits
        if self.num_images_per_prompt > limits.max_images_per_prompt:
            raise InvalidInput(
                "input.num_images_per_prompt",
                f"{self.num_images_per_prompt} is above the limit of "
                f"{limits.max_images_per_prompt}",
            )
        total = len(self.prompts) * self.num_images_per_prompt
        if total > limits.max_prompts * limits.max_images_per_prompt:
            raise InvalidInput("input.prompts", f"{total} images in one job is above the limit")
        for name in ("width", "height"):
            value = getattr(self, name)
            if value is not None and not limits.min_size <= value <= limits.max_size:
                raise InvalidInput(
                    f"input.{name}",
                    f"{value} is outside model {spec.name}'s range "
                    f"{limits.min_size}..{limits.max_size}",
                )
        if self.steps is not None and self.steps > limits.max_steps:
            raise InvalidInput(
                "input.steps",
                f"{self.steps} is above model {spec.name}'s limit of {limits.max_steps}",
            )
        if spec.kind == ModelKind.CLASS_DDPM:
            for i, p in enumerate(self.prompts):
                resolve_class(p, spec.classes, field=f"input.prompts.{i}")


class TextOutput(GeneratedText):
    """One text of a job's output: what its sub-request generated, and where."""

    worker: str | None = None


class ImageOutput(GeneratedImage):
    """One image of a job's output; `url` serves its PNG."""

    url: str
    worker: str | None = None
