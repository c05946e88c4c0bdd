"""Every message that crosses a process boundary, and its one encoding (JSON).

| message | from | through | to |
|---|---|---|---|
| `SubRequest` | API, janitor, draining worker | Celery queue | worker |
| `SubResult` | worker, janitor | Redis results hash | API (joiner, outputs) |
| `CompletionEntry` | Lua scripts (shared/redis_scripts/) | Redis stream `fm:completions` | joiner |
| `LiveEvent` | API, worker | per-job pub/sub channel | SSE, `Prefer: wait` |
| `CancelNotice` | API | pub/sub `fm:cancel` | workers |
| `WorkerHeartbeat` | worker | Redis key with a TTL | API (`/readyz`, `/v1/models`) |
| `DeadLetter` | worker, janitor | Redis list `fm:deadletter` | an operator |

Each is encoded with `encode()` and read back with `decode()` (a union with `decode_event`);
nothing else in the code builds or parses these payloads by hand. A message carries ids and
small inputs, never model state or pickles.
"""

from enum import StrEnum
from typing import Annotated, Any, Literal, Self

from pydantic import BaseModel, Field, TypeAdapter

# The most alternatives a generated token's log-probability comes with (OpenAI's top_logprobs).
MAX_TOP_LOGPROBS = 20


class Message(BaseModel):
    def encode(self) -> str:
        return self.model_dump_json()

    @classmethod
    def decode(cls, raw: str | bytes) -> Self:
        return cls.model_validate_json(raw)


# Outcomes and reasons ------------------------------------------------------------------------


class FinishReason(StrEnum):
    """Why a text sub-request stopped generating."""

    STOP = "stop"  # end of sequence or a stop sequence
    LENGTH = "length"  # max_new_tokens reached
    CANCELED = "canceled"


class StopReason(StrEnum):
    """Why a worker asked a running sub-request to stop at its next step."""

    CANCELED = "canceled"  # its job became final (canceled, failed, past its deadline)
    TIME_LIMIT = "time_limit"
    DRAIN = "drain"  # the worker is shutting down and hands it back


class LeaseOutcome(StrEnum):
    """What taking a sub-request's lease found (shared/redis_scripts/scripts/acquire_lease.lua)."""

    ACQUIRED = "acquired"
    DONE = "done"  # its result is stored already
    FINAL = "final"  # its job is final
    GONE = "gone"  # its job expired or never existed
    BUSY = "busy"  # another delivery holds a live lease on it
    EXHAUSTED = "exhausted"  # it used up its attempts


class Outcome(StrEnum):
    """What a worker did with one delivery of a sub-request (`fibermill_subrequests_total`)."""

    SUCCEEDED = "succeeded"
    FAILED = "failed"
    TIME_LIMIT = "time_limit"
    CANCELED = "canceled"
    HANDED_BACK = "handed_back"
    DUPLICATE = "duplicate"  # ran, but another delivery stored its result first
    # Not run, as the lease found it:
    DONE = "done"
    FINAL = "final"
    GONE = "gone"
    BUSY = "busy"
    EXHAUSTED = "exhausted"


class CompletionKind(StrEnum):
    STARTED = "started"  # the job's first lease was taken
    RESULT = "result"  # a sub-result was stored
    FINAL = "final"  # the job became final


# Sub-requests and their results --------------------------------------------------------------


class JobError(BaseModel):
    code: str = Field(description="A stable, machine-readable reason, such as model_error, "
                      "deadline_exceeded, dead_lettered or time_limit_exceeded")
    message: str = Field(description="What went wrong, for a person")


class ResponseFormat(BaseModel):
    """What a text item's output must be (OpenAI's `response_format`): any JSON object, or JSON
    that validates against `json_schema`; its decoder writes it under a grammar."""

    type: Literal["json_object", "json_schema"]
    json_schema: dict[str, Any] | None = None  # the schema itself, for `json_schema`


class TextItem(BaseModel):
    kind: Literal["text"] = "text"
    prompt: str
    max_new_tokens: int = Field(ge=1)  # the prefill makes one whatever the budget
    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0
    seed: int = 0
    stop: list[str] = []
    # Its text is published as it is decoded, every read (OpenAI `stream: true`); otherwise
    # throttled like step events.
    stream: bool = False
    # Each generated token's log-probability, and the `logprobs` most likely tokens' beside
    # it (0: the chosen token's only); None: none.
    logprobs: int | None = Field(None, ge=0, le=MAX_TOP_LOGPROBS)
    response_format: ResponseFormat | None = None


class ImageItem(BaseModel):
    kind: Literal["image"] = "image"
    prompt: str
    negative_prompt: str = ""
    width: int
    height: int
    steps: int
    guidance_scale: float
    seed: int
    class_label: int | None = None  # class-conditional models only


Item = Annotated[TextItem | ImageItem, Field(discriminator="kind")]


class SubRequest(Message):
    """One prompt (text) or one prompt x image (images) of a job: a Celery task's argument."""

    job_id: str
    index: int
    model: str
    item: Item
    # The API key id the job belongs to (None on an open API): its outputs are filed under it.
    owner: str | None = None
    # Runs in a batch of its own: it was on the device when a worker was lost, and may be what
    # killed it (the janitor sets it when it sends such a sub-request again).
    isolated: bool = False
    # Its job's trace (a W3C traceparent naming the submit span; shared/tracing.py), when the
    # API that stored it traced; carried here because the message, not Celery's headers, is
    # what every sender (the API, the janitor, a draining worker) rebuilds or passes on.
    traceparent: str | None = None
    # When it was put on the queue (epoch seconds), on traced sub-requests only: where the
    # worker's span of its wait in the queue starts.
    sent_at: float | None = None

    @property
    def member(self) -> str:
        """The id of this sub-request in lease, attempt and backlog bookkeeping."""
        return f"{self.job_id}:{self.index}"

    def task_args(self) -> list[dict[str, Any]]:
        # Celery's JSON serializer carries the dict; the worker's task validates it back.
        return [self.model_dump(mode="json")]

    @classmethod
    def from_task_arg(cls, payload: dict[str, Any]) -> Self:
        return cls.model_validate(payload)


class TopLogprob(BaseModel):
    token: str = Field(description="The token's text (bytes that are not whole UTF-8 "
                       "characters decode to U+FFFD; `bytes` has them exactly)")
    bytes: list[int] = Field(description="The token's bytes")
    logprob: float = Field(description="Its natural log-probability under the model, before "
                           "temperature, top-k and top-p")


class TokenLogprob(TopLogprob):
    """A generated token's log-probability, and the most likely tokens at its place."""

    top_logprobs: list[TopLogprob] = Field(
        default_factory=list, description="The most likely tokens at this place, most likely "
        "first, as many as asked")


class GeneratedText(BaseModel):
    text: str = Field(description="The generated text, without the prompt")
    finish_reason: FinishReason = Field(description=(
        "stop: the end-of-text token or a stop string; length: max_new_tokens reached; "
        "canceled: the job was canceled while it generated"))
    tokens: int = Field(description="Number of generated tokens")
    prompt_tokens: int | None = Field(None, description="Number of prompt tokens the model "
                                      "read (after truncation to its context)")
    # Left out of the JSON unless asked: outputs and events keep the shape they had.
    logprobs: list[TokenLogprob] | None = Field(
        None, exclude_if=lambda v: v is None,
        description="Each generated token's log-probability, when `logprobs` was asked")


class GeneratedImage(BaseModel):
    """An image's description; its PNG bytes are stored beside the sub-result."""

    seed: int = Field(description="The seed this image was made with; it reproduces it")
    width: int = Field(description="Width in pixels")
    height: int = Field(description="Height in pixels")


class SubResult(Message):
    """What a worker stores once per (job, index)."""

    index: int
    output: GeneratedText | GeneratedImage | None = None
    # The blob store key of the output's bytes (an image's PNG); the bytes never pass
    # through Redis.
    blob: str | None = None
    error: JobError | None = None
    worker: str = ""
    started_at: float | None = None  # the worker took it (its usage's device time starts)
    finished_at: float | None = None
    # It started on the device (its batch began, or its row joined the decoder), for the
    # job's timeline; None when it never got there.
    run_started_at: float | None = None

    @property
    def ok(self) -> bool:
        return self.error is None


class DeadLetter(Message):
    """A sub-request given up after its attempts, kept in `fm:deadletter` for an operator:
    which one, whose, and why. Never its prompt: the list outlives the job's record, and its
    readers need not see what a key's callers wrote (the job, while kept, has it)."""

    job_id: str
    index: int
    model: str
    owner: str | None = None
    code: str
    reason: str
    attempts: int
    prompt_chars: int
    at: float

    @classmethod
    def of(cls, sub: SubRequest, error: JobError | None, attempts: int, at: float) -> Self:
        return cls(job_id=sub.job_id, index=sub.index, model=sub.model, owner=sub.owner,
                   code=error.code if error else "", reason=error.message if error else "",
                   attempts=attempts, prompt_chars=len(sub.item.prompt), at=at)


class CompletionEntry(BaseModel):
    """An entry of the completion stream. The Lua scripts write it (XADD with these field
    names); the joiner reads it here."""

    job: str
    kind: CompletionKind = CompletionKind.RESULT  # entries without a kind are results
    index: int | None = None
    ok: bool | None = None

    @classmethod
    def from_fields(cls, fields: dict[bytes, bytes]) -> Self:
        return cls.model_validate({k.decode(): v.decode() for k, v in fields.items()})


# Live events ---------------------------------------------------------------------------------


class Progress(BaseModel):
    done: int = Field(description="Outputs finished (succeeded or failed)")
    total: int = Field(description="Outputs the job makes: one per prompt for text, prompts x "
                       "num_images_per_prompt for images")


class StepData(BaseModel):
    index: int  # the sub-request
    step: int
    steps: int


class StepEvent(Message):
    """A denoise or decode step of one sub-request (published by its worker, throttled)."""

    event: Literal["step"] = "step"
    data: StepData


class OutputData(BaseModel):
    index: int  # the sub-request
    text: str  # text decoded since this index's previous output event
    # Where `text` starts in the output's text: a receiver sees a lost event as a gap, and a
    # sub-request run again (after a drain, a lost worker) as a repeat from an earlier offset.
    offset: int = 0
    tokens: int  # tokens generated so far
    # Set on the index's last output event, which carries the rest of its text.
    finish_reason: FinishReason | None = None
    prompt_tokens: int | None = None
    # The log-probabilities of the tokens generated since this index's previous output event,
    # when its item asked for them (its text may lag its tokens by a few characters).
    logprobs: list[TokenLogprob] | None = Field(None, exclude_if=lambda v: v is None)


class OutputEvent(Message):
    """New text of a text sub-request, as its worker decodes it: the deltas of one index, in
    order, add up to its output's text."""

    event: Literal["output"] = "output"
    data: OutputData


class ProgressEvent(Message):
    event: Literal["progress"] = "progress"
    data: Progress


class StatusEvent(Message):
    """The job changed status; `data` is its envelope (shared/job.py `Job`), or only its `id`
    and `status` when a Lua script publishes it (the job started)."""

    event: Literal["status"] = "status"
    data: dict[str, Any]


LiveEvent = Annotated[StepEvent | OutputEvent | ProgressEvent | StatusEvent,
                      Field(discriminator="event")]
_LIVE_EVENT: TypeAdapter[LiveEvent] = TypeAdapter(LiveEvent)


def decode_event(raw: str | bytes) -> StepEvent | OutputEvent | ProgressEvent | StatusEvent:
    return _LIVE_EVENT.validate_json(raw)


# Control --------------------------------------------------------------------------------------


class CancelNotice(Message):
    """Stop every running sub-request of this job: it became final."""

    job_id: str


class WorkerHeartbeat(Message):
    """A worker process announcing itself and what it serves."""

    id: str
    name: str
    host: str
    pid: int
    device: str
    models: list[str]
    in_flight: int = 0
    started_at: float
    seen_at: float
