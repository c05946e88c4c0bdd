"""Per-task job inputs and outputs (the external contract), with checks against a model's limits."""

from typing import Annotated, Any, TypeVar

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    StringConstraints,
    ValidationError,
    ValidationInfo,
    field_validator,
)
from pydantic_core import PydanticCustomError

from shared.class_prompts import resolve_class
from shared.errors import InvalidInput
from shared.grammar_schema import check_schema
from shared.messages import MAX_TOP_LOGPROBS, GeneratedImage, GeneratedText, ResponseFormat
from shared.problems import from_validation_error
from shared.registry import ModelKind, ModelSpec, Task

Seed = Annotated[int, Field(ge=0, le=2**31 - 1)]

# Bounds of fields whose values reach the model as numbers: an unbounded one is a way to fail
# every request batched with it.
MAX_TOP_K = 1000
MAX_STOP_CHARS = 256
MAX_GUIDANCE = 50.0

_N = TypeVar("_N", int, float)


def _spec(info: ValidationInfo) -> ModelSpec | None:
    """The model the input is for, when validated against one (`validate_input`): its limits
    are checked in the same pass as the field types, so every problem is reported at once."""
    return (info.context or {}).get("spec")


def _value_within(value: _N, limit_name: str, info: ValidationInfo) -> _N:
    """`value` unless it is above the model's limit `limit_name`."""
    spec = _spec(info)
    if spec is not None:
        limit = getattr(spec.limits, limit_name)
        if value > limit:
            raise PydanticCustomError(
                "above_limit", "{value} is above model {model}'s limit of {limit}",
                {"value": value, "model": spec.name, "limit": limit})
    return value


def _count_within(items: list[str], noun: str, limit_name: str,
                  info: ValidationInfo) -> list[str]:
    """`items` unless there are more than the model's limit `limit_name`."""
    spec = _spec(info)
    if spec is not None:
        limit = getattr(spec.limits, limit_name)
        if len(items) > limit:
            raise PydanticCustomError(
                "above_limit", "{count} {noun}; model {model} takes at most {limit}",
                {"count": len(items), "noun": noun, "model": spec.name, "limit": limit})
    return items


def _check_prompt(prompt: str, info: ValidationInfo) -> str:
    spec = _spec(info)
    if spec is None:
        return prompt
    if len(prompt) > spec.limits.max_prompt_chars:
        raise PydanticCustomError(
            "above_limit", "is {length} characters long; model {model} takes at most {limit}",
            {"length": len(prompt), "model": spec.name, "limit": spec.limits.max_prompt_chars},
        )
    if spec.kind == ModelKind.CLASS_DDPM:
        try:
            resolve_class(prompt, spec.classes)
        except InvalidInput as exc:
            raise PydanticCustomError("unknown_class", exc.message) from None
    return prompt


Prompt = Annotated[str, StringConstraints(min_length=1), AfterValidator(_check_prompt)]


class _Input(BaseModel):
    # NaN and Infinity are refused everywhere: no bound catches NaN.
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    prompts: list[Prompt] = Field(
        min_length=1, description="One or more prompts; each becomes its own sub-request(s), "
        "and the job's outputs come back in the same order.")
    seed: Seed | None = Field(None, description=(
        "Makes the output reproducible: the same seed and input give the same output. Chosen "
        "at random and stored with the job when absent; output i of a job uses seed + i."))

    @field_validator("prompts")
    @classmethod
    def _prompt_count(cls, prompts: list[str], info: ValidationInfo) -> list[str]:
        return _count_within(prompts, "prompts", "max_prompts", info)


class TextGenerationInput(_Input):
    """Input of a text-generation job (causal language models)."""

    max_new_tokens: int | None = Field(
        None, ge=1, description="Tokens to generate per prompt at most; the model's default "
        "when absent. Generation also ends at the end-of-text token or a stop string.")
    temperature: float = Field(0.0, ge=0.0, le=5.0,
                               description="Sampling temperature; 0 means greedy decoding")
    top_p: float = Field(1.0, gt=0.0, le=1.0,
                         description="Nucleus sampling: keep the smallest set of tokens whose "
                         "probabilities add up to top_p (1 keeps all)")
    top_k: int = Field(0, ge=0, le=MAX_TOP_K,
                       description="Keep only the k most likely tokens; 0 disables top-k")
    stop: list[Annotated[str, StringConstraints(min_length=1, max_length=MAX_STOP_CHARS)]] = Field(
        default_factory=list, description="Strings that end a prompt's generation; the text "
        "returned stops before the first one found")
    stream: bool = Field(False, description="Publish each output's text on the job's event "
                         "stream as it is decoded (`output` events, every few tokens); "
                         "otherwise output events come at most about ten times a second")
    logprobs: int | None = Field(None, ge=0, le=MAX_TOP_LOGPROBS, description=(
        "Return each generated token's log-probability (in `output[i].logprobs`, and in "
        "streamed `output` events), with this many of the most likely tokens at each place "
        "(0: the chosen token's only)"))
    response_format: ResponseFormat | None = Field(None, description=(
        'Structured output: {"type": "json_object"} writes a JSON object, {"type": '
        '"json_schema", "json_schema": {...}} JSON that validates against the schema given; '
        "decoded under a grammar, it always parses, also when max_new_tokens runs short"))

    @field_validator("response_format")
    @classmethod
    def _decodable(cls, value: ResponseFormat | None) -> ResponseFormat | None:
        if value is None:
            return value
        if value.type == "json_object":
            if value.json_schema is not None:
                raise ValueError("json_schema is given only with type json_schema")
            return value
        if value.json_schema is None:
            raise ValueError("type json_schema needs json_schema, the schema itself")
        try:
            check_schema(value.json_schema, field="json_schema")
        except InvalidInput as exc:
            raise ValueError(str(exc)) from None
        return value

    @field_validator("max_new_tokens")
    @classmethod
    def _max_new_tokens(cls, value: int | None, info: ValidationInfo) -> int | None:
        return None if value is None else _value_within(value, "max_new_tokens", info)

    @field_validator("stop")
    @classmethod
    def _stop_count(cls, value: list[str], info: ValidationInfo) -> list[str]:
        return _count_within(value, "stop strings", "max_stop_sequences", info)


class ImageGenerationInput(_Input):
    """Input of an image-generation job (diffusion models)."""

    negative_prompt: str = Field("", description="What the image should not show (guided "
                                 "models only)")
    num_images_per_prompt: int = Field(1, ge=1, description="Images made from each prompt, "
                                       "each with its own seed")
    width: int | None = Field(None, ge=8, description="Width in pixels, a multiple of 8; the "
                              "model's default when absent")
    height: int | None = Field(None, ge=8, description="Height in pixels, a multiple of 8; "
                               "the model's default when absent")
    steps: int | None = Field(None, ge=1, description="Denoising steps; more is slower and "
                              "usually finer. The model's default when absent")
    guidance_scale: float | None = Field(
        None, ge=0.0, le=MAX_GUIDANCE, description="Classifier-free guidance: how strongly the "
        "image follows the prompt (0 or 1 turn guidance off). The model's default when absent")

    @field_validator("width", "height")
    @classmethod
    def _size(cls, value: int | None, info: ValidationInfo) -> int | None:
        if value is None:
            return value
        # Latent diffusion downsamples by 8: other sizes cannot be decoded back exactly.
        if value % 8:
            raise PydanticCustomError("multiple_of", "must be a multiple of 8, got {value}",
                                      {"value": value})
        spec = _spec(info)
        if spec is not None and not spec.limits.min_size <= value <= spec.limits.max_size:
            lo, hi = spec.limits.min_size, spec.limits.max_size
            raise PydanticCustomError(
                "outside_range",
                "must be {lo} for model {model}" if lo == hi
                else "{value} is outside model {model}'s range {lo}..{hi}",
                {"value": value, "model": spec.name, "lo": lo, "hi": hi},
            )
        return value

    @field_validator("steps")
    @classmethod
    def _steps(cls, value: int | None, info: ValidationInfo) -> int | None:
        return None if value is None else _value_within(value, "max_steps", info)

    @field_validator("num_images_per_prompt")
    @classmethod
    def _images(cls, value: int, info: ValidationInfo) -> int:
        return _value_within(value, "max_images_per_prompt", info)


TaskInput = TextGenerationInput | ImageGenerationInput
INPUTS: dict[Task, type[TextGenerationInput] | type[ImageGenerationInput]] = {
    "text-generation": TextGenerationInput,
    "image-generation": ImageGenerationInput,
}


def validate_input(spec: ModelSpec, raw: Any) -> TaskInput:
    """`raw` as the input of a job for `spec`'s model: its types, bounds and the model's own
    limits, every problem at once (InvalidInput), fields named from the body's root."""
    try:
        return INPUTS[spec.task].model_validate(raw, context={"spec": spec})
    except ValidationError as exc:
        raise InvalidInput.of(from_validation_error(exc, prefix="input")) from None


class TextOutput(GeneratedText):
    """One text of a job's output: what its sub-request generated, and where."""

    worker: str | None = Field(None, description="The worker process that generated it")

    @classmethod
    def of(cls, text: GeneratedText, worker: str | None) -> "TextOutput":
        """The output of the sub-result that generated `text` on `worker`: as the API
        assembles it, and as a worker that makes a one-prompt job final writes it."""
        return cls(worker=worker, **text.model_dump())


class ImageOutput(GeneratedImage):
    """One image of a job's output; `url` serves its PNG."""

    url: str = Field(description="Where its PNG is served (GET, same API key)")
    worker: str | None = Field(None, description="The worker process that generated it")
