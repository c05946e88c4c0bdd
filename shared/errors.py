"""The one tree of domain errors. The API maps it to HTTP in services/api/errors.py."""

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Problem:
    """One thing wrong with a request: the field (dotted from the body's root, such as
    "input.width"), what is wrong with it in words that name the limit, and a short code."""

    field: str
    message: str
    code: str = "invalid_input"


class FibermillError(Exception):
    """Base of every error Fibermill raises on purpose."""

    code = "internal_error"


class GraphError(FibermillError):
    """A worker pipeline graph that routes to an operator it does not have, or nowhere."""

    code = "graph_error"


class InvalidInput(FibermillError):
    """One or more request fields are out of bounds or not understood: every problem a
    request has is reported at once, not the first one found."""

    code = "invalid_input"

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field
        self.message = message
        self.problems = [Problem(field, message, self.code)]

    @classmethod
    def of(cls, problems: Iterable[Problem]) -> "InvalidInput":
        found = list(problems)
        first = found[0]
        exc = cls(first.field, first.message)
        exc.problems = found
        exc.args = ("; ".join(f"{p.field}: {p.message}" for p in found),)
        return exc


class ContextLengthExceeded(InvalidInput):
    """A prompt and the tokens asked for past the model's context: refused, never cut.
    `completion` is None when the budget was left out and the prompt alone leaves no room.
    OpenAI's paths word it as OpenAI does (services/api/openai/errors.py)."""

    code = "context_length_exceeded"

    def __init__(self, field: str, model: str, context: int, prompt: int,
                 completion: int | None) -> None:
        if completion is None:
            message = (f"is {prompt} tokens long, which leaves no room for a new token in "
                       f"model {model}'s context of {context} tokens")
        else:
            message = (f"is {prompt} tokens long; with max_new_tokens {completion} that is "
                       f"{prompt + completion} tokens, above model {model}'s context of "
                       f"{context} tokens")
        super().__init__(field, message)
        self.model = model
        self.context = context
        self.prompt = prompt
        self.completion = completion


class UnknownModel(InvalidInput):
    code = "unknown_model"

    def __init__(self, model: str, known: list[str]) -> None:
        super().__init__("model", f"unknown model {model!r}; known models: {', '.join(known)}")


class ModelNotFound(FibermillError):
    """A model asked for by name in a path (GET /v1/models/{model}) that the registry lacks."""

    code = "model_not_found"

    def __init__(self, model: str) -> None:
        super().__init__(f"model {model!r} not found")


class JobNotFound(FibermillError):
    code = "not_found"

    def __init__(self, job_id: str) -> None:
        super().__init__(f"job {job_id} not found")
        self.job_id = job_id


class OutputNotFound(FibermillError):
    code = "not_found"


class Expired(FibermillError):
    """What was asked for existed, and its retention has ended (HTTP 410 Gone)."""

    code = "expired"


class JobExpired(Expired, JobNotFound):
    def __init__(self, job_id: str, ttl_seconds: int) -> None:
        FibermillError.__init__(
            self, f"job {job_id} has expired: a finished job's record is kept for "
                  f"{_duration(ttl_seconds)} (FIBERMILL_FINISHED_JOB_TTL_SECONDS)")
        self.job_id = job_id


class OutputExpired(Expired, OutputNotFound):
    def __init__(self, job_id: str, index: int, ttl_seconds: int) -> None:
        super().__init__(
            f"output {index} of job {job_id} has expired: outputs are kept for "
            f"{_duration(ttl_seconds)} after their job was made (FIBERMILL_OUTPUT_TTL_SECONDS)")


def _duration(seconds: int) -> str:
    for unit, size in (("day", 86400), ("hour", 3600), ("minute", 60)):
        if seconds % size == 0 and seconds >= 2 * size:
            n = seconds // size
            return f"{n} {unit}{'s' if n != 1 else ''}"
    return f"{seconds} seconds"


class InvalidTransition(FibermillError):
    """A status change that the job's current status does not allow (e.g. leaving a final state)."""

    code = "invalid_transition"


class ServiceUnavailable(FibermillError):
    """Try again later: a model's queue is full, or a dependency is down."""

    code = "unavailable"

    def __init__(self, message: str, retry_after: int = 5) -> None:
        super().__init__(message)
        self.retry_after = retry_after


class NotReplicated(ServiceUnavailable):
    """A write that makes a job reached the Redis primary but not the replicas it must wait
    for (`FIBERMILL_REDIS_MIN_REPLICAS`) in time: a failover now could lose it. A job's
    creation answers 503 then; retried with the same Idempotency-Key it returns that job."""

    code = "not_replicated"

    def __init__(self, acked: int, wanted: int, timeout_ms: int, job: Any = None) -> None:
        super().__init__(f"the job was stored on the Redis primary, but {acked} of the "
                         f"{wanted} replicas it must reach acknowledged it within "
                         f"{timeout_ms} ms; retry with the same Idempotency-Key",
                         retry_after=2)
        self.acked = acked
        self.wanted = wanted
        self.job = job  # the record as stored on the primary


class RateLimited(FibermillError):
    code = "rate_limited"

    def __init__(self, message: str, retry_after: int) -> None:
        super().__init__(message)
        self.retry_after = retry_after


class QuotaExceeded(RateLimited):
    """An API key holds all its quota allows at once (open batches, its share of a model's
    queue for batch work): the message names the quota and the count."""

    code = "quota_exceeded"


class Unauthorized(FibermillError):
    code = "unauthorized"


class IdempotencyConflict(FibermillError):
    """The Idempotency-Key was used before with a different request body."""

    code = "idempotency_conflict"


class PayloadTooLarge(FibermillError):
    code = "payload_too_large"


class StorageQuotaExceeded(PayloadTooLarge):
    """An upload would take the bytes an API key's files hold past its quota."""

    code = "storage_quota_exceeded"


class WebhookSecretNotRotatable(FibermillError):
    """A rotation asked of an open API (no API keys), whose webhooks are signed with the
    installation's one secret: it is set and changed where it is kept, not through the API."""

    code = "not_rotatable"


class WaitTimedOut(FibermillError):
    """A synchronous call (the OpenAI-compatible endpoints) waited its longest for its job,
    which runs on: the message names it, so the caller can still collect it."""

    code = "timeout"

    def __init__(self, job_id: str, seconds: int) -> None:
        super().__init__(
            f"job {job_id} did not finish within {seconds} s (FIBERMILL_OPENAI_WAIT_SECONDS); "
            f"it runs on: GET /v1/jobs/{job_id}")
        self.job_id = job_id


class DeadlineExceeded(FibermillError):
    code = "deadline_exceeded"


class ModelNotLoadable(FibermillError):
    """A registry entry that this worker cannot load: said in one line that names the model's
    folder and what is wrong with it, and the worker exits."""

    code = "model_not_loadable"


class ModelFilesMissing(ModelNotLoadable):
    """A registry entry whose model folder, or a file the model needs, does not exist here."""

    code = "model_files_missing"


class ModelError(FibermillError):
    """A model raised while running a sub-request."""

    code = "model_error"


class DeadLettered(FibermillError):
    """A sub-request exhausted its attempts (each one killed or lost its worker)."""

    code = "dead_lettered"


class TimeLimitExceeded(FibermillError):
    code = "time_limit_exceeded"


class BlobNotFound(OutputNotFound):
    """No object under this key in the blob store (shared/blobstore): never written, deleted,
    or swept after its time to live."""

    code = "not_found"

    def __init__(self, key: str) -> None:
        super().__init__(f"blob {key} not found")
        self.key = key


class InvalidBlobKey(FibermillError):
    """A blob store key that every backend cannot hold the same way: empty, absolute, with an
    empty, `.` or `..` segment, a segment that starts with `.`, or a character outside the safe
    set. Keys are built by Fibermill itself, so this is a bug, not a client's mistake."""

    code = "invalid_blob_key"

    def __init__(self, key: str, reason: str) -> None:
        super().__init__(f"invalid blob key {key!r}: {reason}")
        self.key = key
        self.reason = reason


class BlobStoreUnavailable(ServiceUnavailable):
    """The blob store could not be reached, or refused, after the client's own retries: says
    which store, which operation (and key), and what went wrong."""

    code = "blob_store_unavailable"

    def __init__(self, store: str, operation: str, detail: str, key: str | None = None) -> None:
        what = f"{operation} {key}" if key else operation
        super().__init__(f"blob store {store} unavailable: {what} failed: {detail}")
        self.store = store
        self.operation = operation
        self.key = key
