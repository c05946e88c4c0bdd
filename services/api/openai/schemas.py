"""The requests of OpenAI's chat, completion and image endpoints, as far as Fibermill can honour
them. A field OpenAI defines that Fibermill cannot honour is refused with a 400 naming it (never
ignored in silence); a field OpenAI does not define is refused as OpenAI refuses it.

Defaults are OpenAI's, not Fibermill's: sampling at temperature 1, 16 tokens for a completion.
"""

from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    StringConstraints,
    ValidationInfo,
    field_validator,
)

from shared.errors import InvalidInput
from shared.grammar_schema import check_schema
from shared.inputs import MAX_STOP_CHARS, Seed
from shared.messages import MAX_TOP_LOGPROBS

# OpenAI's legacy limit on a completion's `logprobs` (its chat's `top_logprobs` goes to 20).
MAX_COMPLETION_LOGPROBS = 5

Stop = Annotated[str, StringConstraints(min_length=1, max_length=MAX_STOP_CHARS)]


def _unsupported(what: str) -> ValueError:
    return ValueError(f"is not supported by this server ({what})")


class _Request(BaseModel):
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    model: str = Field(min_length=1, description="A model name from GET /v1/models")
    user: str | None = Field(None, max_length=256,
                             description="Your end user's id; accepted, not recorded")


class StreamOptions(BaseModel):
    model_config = ConfigDict(extra="forbid")
    include_usage: bool = Field(False, description="End the stream with a chunk that "
                                "carries the usage (and no choices)")


class _TextRequest(_Request):
    temperature: float = Field(1.0, ge=0.0, le=2.0, description="Sampling temperature; 0 "
                               "is greedy decoding")
    top_p: float = Field(1.0, gt=0.0, le=1.0, description="Nucleus sampling mass")
    n: int = Field(1, ge=1, le=16, description="Choices to generate (each prompt's); choice "
                   "i is sampled with seed + i")
    stop: list[Stop] = Field(default_factory=list, description="A string or a list of them")
    seed: Seed | None = Field(None, description="Makes sampling reproducible; chosen at "
                              "random when absent")
    stream: bool = Field(False, description="Answer with Server-Sent Events as tokens are "
                         "decoded, ending with `data: [DONE]`")
    stream_options: StreamOptions | None = Field(None, description="Options of a stream")
    frequency_penalty: float = Field(0.0, description="Only 0 is supported")
    presence_penalty: float = Field(0.0, description="Only 0 is supported")
    logit_bias: dict[str, float] | None = Field(None, description="Only empty is supported")
    response_format: dict[str, Any] | None = Field(None, description=(
        '{"type": "text"} (the default), {"type": "json_object"} (a JSON object), or '
        '{"type": "json_schema", "json_schema": {"name": ..., "schema": {...}}} (JSON that '
        "validates against the schema, whatever `strict` says); decoded under a grammar, the "
        "output always parses, also when max_tokens runs short"))

    @field_validator("response_format")
    @classmethod
    def _format(cls, value: dict[str, Any] | None) -> dict[str, Any] | None:
        if value is None or value == {"type": "text"}:
            return None
        kind = value.get("type")
        if kind == "json_object":
            return value
        if kind != "json_schema":
            raise ValueError(f"type must be text, json_object or json_schema, not {kind!r}")
        spec = value.get("json_schema")
        if not isinstance(spec, dict) or not isinstance(spec.get("schema"), dict):
            raise ValueError("json_schema must be an object holding the schema as `schema`")
        try:
            check_schema(spec["schema"])
        except InvalidInput as exc:
            raise ValueError(str(exc)) from None
        return value

    @property
    def structured(self) -> dict[str, Any] | None:
        """The job input's `response_format`: None for plain text."""
        if self.response_format is None:
            return None
        if self.response_format["type"] == "json_object":
            return {"type": "json_object"}
        return {"type": "json_schema", "json_schema": self.response_format["json_schema"]["schema"]}

    @field_validator("stop", mode="before")
    @classmethod
    def _stop_list(cls, value: Any) -> Any:
        return [value] if isinstance(value, str) else [] if value is None else value

    @field_validator("frequency_penalty", "presence_penalty")
    @classmethod
    def _no_penalty(cls, value: float) -> float:
        if value != 0:
            raise _unsupported("only 0")
        return value

    @field_validator("logit_bias")
    @classmethod
    def _no_bias(cls, value: dict[str, float] | None) -> dict[str, float] | None:
        if value:
            raise _unsupported("only an empty one")
        return value

    @property
    def usage_streamed(self) -> bool:
        return self.stream_options is not None and self.stream_options.include_usage


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="forbid")
    role: Literal["system", "developer", "user", "assistant"] = Field(
        description="Who says it")
    content: str = Field(description="Text, or a list of text parts")
    name: str | None = Field(None, max_length=64, description="A participant's name; "
                             "accepted, not passed to the template")

    @field_validator("content", mode="before")
    @classmethod
    def _text_parts(cls, value: Any) -> Any:
        if not isinstance(value, list):
            return value
        texts = []
        for part in value:
            if not isinstance(part, dict) or part.get("type") != "text" or not isinstance(
                    part.get("text"), str):
                raise ValueError("only text parts ({\"type\": \"text\", \"text\": ...}) are "
                                 "supported by the models served here")
            texts.append(part["text"])
        return "".join(texts)


class ChatCompletionRequest(_TextRequest):
    messages: list[ChatMessage] = Field(min_length=1, description="The conversation so far, "
                                        "rendered with the model's chat template")
    max_tokens: int | None = Field(None, ge=1, description="Tokens to generate at most; the "
                                   "model's default when absent")
    max_completion_tokens: int | None = Field(None, ge=1, description="As max_tokens "
                                              "(OpenAI's newer name); it wins when both are set")
    logprobs: bool = Field(False, description="Return each generated token's "
                           "log-probability (in `choices[i].logprobs.content`)")
    top_logprobs: int | None = Field(None, ge=0, le=MAX_TOP_LOGPROBS, description=(
        "With each token, this many of the most likely tokens at its place; needs "
        "`logprobs: true`"))
    tools: list[Any] | None = Field(None, description="Not supported (only empty)")
    tool_choice: Any = Field(None, description='Not supported (only "none")')
    functions: list[Any] | None = Field(None, description="Not supported (only empty)")
    function_call: Any = Field(None, description='Not supported (only "none")')
    parallel_tool_calls: bool | None = Field(None, description="Accepted; no tools are called")
    store: bool = Field(False, description="Only false is supported")
    metadata: dict[str, str] | None = Field(None, description="Accepted, not recorded")
    service_tier: str | None = Field(None, description="Only auto or default")

    @field_validator("store")
    @classmethod
    def _not_true(cls, value: bool) -> bool:
        if value:
            raise _unsupported("only false")
        return value

    @field_validator("top_logprobs")
    @classmethod
    def _with_logprobs(cls, value: int | None, info: ValidationInfo) -> int | None:
        # As OpenAI: alternatives without the chosen tokens' log-probabilities are refused.
        if value is not None and info.data.get("logprobs") is not True:
            raise ValueError("needs logprobs to be true")
        return value

    @field_validator("tools", "functions")
    @classmethod
    def _no_tools(cls, value: list[Any] | None) -> list[Any] | None:
        if value:
            raise _unsupported("the models served here do not call tools")
        return value

    @field_validator("tool_choice", "function_call")
    @classmethod
    def _no_tool_choice(cls, value: Any) -> Any:
        if value not in (None, "none"):
            raise _unsupported("the models served here do not call tools")
        return value

    @field_validator("service_tier")
    @classmethod
    def _tier(cls, value: str | None) -> str | None:
        if value not in (None, "auto", "default"):
            raise _unsupported("only auto or default")
        return value

    @property
    def budget(self) -> int | None:
        return self.max_completion_tokens or self.max_tokens

    @property
    def alternatives(self) -> int | None:
        """The job input's `logprobs`: None when none are asked."""
        return (self.top_logprobs or 0) if self.logprobs else None


class CompletionRequest(_TextRequest):
    prompt: list[Annotated[str, StringConstraints(min_length=1)]] = Field(
        min_length=1, description="A string or a list of them (token arrays are not taken)")
    max_tokens: int | None = Field(16, ge=1, description="Tokens to generate at most")
    echo: bool = Field(False, description="Start each choice's text with its prompt")
    best_of: int | None = Field(None, description="Only 1 is supported")
    logprobs: int | None = Field(None, ge=0, le=MAX_COMPLETION_LOGPROBS, description=(
        "Return each generated token's log-probability, with this many of the most likely "
        "tokens at its place (0: the chosen token's only); null: none"))
    suffix: str | None = Field(None, description="Not supported (only empty)")

    @field_validator("prompt", mode="before")
    @classmethod
    def _prompt_list(cls, value: Any) -> Any:
        return [value] if isinstance(value, str) else value

    @field_validator("best_of")
    @classmethod
    def _best_of(cls, value: int | None) -> int | None:
        if value not in (None, 1):
            raise _unsupported("only 1")
        return value

    @field_validator("suffix")
    @classmethod
    def _no_suffix(cls, value: str | None) -> str | None:
        if value:
            raise _unsupported("the models served here do not insert text")
        return value

    @property
    def alternatives(self) -> int | None:
        """The job input's `logprobs`: None when none are asked."""
        return self.logprobs


class ImageGenerationRequest(_Request):
    prompt: str = Field(min_length=1, description="What to draw")
    n: int = Field(1, ge=1, le=10, description="Images to make; image i uses seed + i")
    size: str | None = Field(None, pattern=r"^(auto|\d{1,5}x\d{1,5})$",
                             description="WIDTHxHEIGHT within the model's sizes, or auto (its "
                             "default)")
    response_format: Literal["url", "b64_json"] = Field(
        "url", description="url: a link to the PNG; b64_json: the PNG inline")
    quality: Literal["auto", "standard"] | None = Field(None, description="Only auto or "
                                                        "standard")
    style: None = Field(None, description="Not supported (only null)")
    seed: Seed | None = Field(None, description="Fibermill's own: makes the images "
                              "reproducible")

    @property
    def dimensions(self) -> tuple[int, int] | None:
        if self.size in (None, "auto"):
            return None
        width, height = self.size.split("x")
        return int(width), int(height)


OpenAIRequest = ChatCompletionRequest | CompletionRequest | ImageGenerationRequest
