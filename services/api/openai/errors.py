"""OpenAI's error body, `{"error": {"message", "type", "param", "code"}}`, for the domain errors
of the OpenAI-compatible paths. services/api/errors.py picks this format by path, so one set of
domain errors serves both APIs.

OpenAI answers a request it cannot take with 400 (Fibermill's own API says 422); the other
statuses are the same in both."""

from typing import Any

from pydantic import BaseModel, Field

from shared.errors import (
    ContextLengthExceeded,
    Expired,
    FibermillError,
    InvalidInput,
    JobNotFound,
    OutputNotFound,
    PayloadTooLarge,
    QuotaExceeded,
    RateLimited,
    ServiceUnavailable,
    Unauthorized,
    WaitTimedOut,
)

# Where a path starts, it speaks OpenAI. /v1/models is shared: its answer carries both shapes,
# and its errors keep Fibermill's.
PREFIXES = ("/v1/chat/", "/v1/completions", "/v1/images/", "/v1/files", "/v1/batches")


def speaks_openai(path: str) -> bool:
    return path.startswith(PREFIXES)


def error_body(message: str, type: str = "invalid_request_error", param: str | None = None,
               code: str | None = None) -> dict[str, Any]:
    return {"error": {"message": message, "type": type, "param": param, "code": code}}


def openai_error(exc: FibermillError, status: int, path: str = "") -> tuple[int, dict[str, Any]]:
    """The status and body of a domain error on the OpenAI path `path` (`status`: Fibermill's
    own)."""
    if isinstance(exc, ContextLengthExceeded):
        return 400, _context_error(exc, "messages" if path.startswith("/v1/chat/") else "prompt")
    if isinstance(exc, InvalidInput):
        first = exc.problems[0]
        message = "; ".join(f"{p.field}: {p.message}" for p in exc.problems)
        code = "model_not_found" if first.code == "unknown_model" else first.code
        return (404 if code == "model_not_found" else 400), error_body(
            message, param=first.field, code=code)
    kind = "invalid_request_error"
    if isinstance(exc, Unauthorized):
        kind, code = "invalid_request_error", "invalid_api_key"
    elif isinstance(exc, QuotaExceeded):
        kind, code = "rate_limit_error", exc.code
    elif isinstance(exc, RateLimited):
        kind, code = "rate_limit_error", "rate_limit_exceeded"
    elif isinstance(exc, WaitTimedOut):
        kind, code = "timeout", exc.code
    elif isinstance(exc, ServiceUnavailable):
        kind, code = "server_error", exc.code
    elif isinstance(exc, Expired | JobNotFound | OutputNotFound | PayloadTooLarge):
        code = exc.code
    else:
        kind, code = ("server_error" if status >= 500 else kind), exc.code
    return status, error_body(str(exc), kind, None, code)


def _context_error(exc: ContextLengthExceeded, param: str) -> dict[str, Any]:
    """OpenAI's own words for it, which clients match to shorten a conversation."""
    said = f"This model's maximum context length is {exc.context} tokens. However, "
    if exc.completion is None:
        said += (f"your {param} resulted in {exc.prompt} tokens. Please reduce the length of "
                 f"the {param}.")
    else:
        said += (f"you requested {exc.prompt + exc.completion} tokens ({exc.prompt} in the "
                 f"{param}, {exc.completion} in the completion). Please reduce the length of "
                 f"the {param} or completion.")
    return error_body(said, param=param, code=exc.code)


class OpenAIErrorDetail(BaseModel):
    message: str = Field(description="What went wrong, for a person")
    type: str = Field(description="invalid_request_error, rate_limit_error, server_error or "
                      "timeout")
    param: str | None = Field(None, description="The request field at fault, if one is")
    code: str | None = Field(None, description="A stable, machine-readable reason")


class OpenAIErrorBody(BaseModel):
    """OpenAI's error answer."""

    error: OpenAIErrorDetail = Field(description="The error")


_WHY = {
    400: "The request is not valid, or asks what this server cannot do; `param` names the "
         "field. A prompt that does not fit the model's context with its max_tokens: "
         "context_length_exceeded",
    401: "No API key, or one this deployment does not know (when keys are on)",
    404: "No such model (model_not_found), or no such object for this API key",
    409: "The job was canceled before it finished",
    413: "The body is larger than the server's limit",
    429: ("Rate limited, a per-key quota reached, or too many open streams and waits; retry "
          "after Retry-After seconds"),
    500: "The job failed (its code says why: model_error, dead_lettered...)",
    503: "The model's queue is full, or a store is unreachable; retry after Retry-After",
    504: "The job did not finish within FIBERMILL_OPENAI_WAIT_SECONDS; it runs on, and the "
         "message names it",
}


def openai_errors(*statuses: int) -> dict[int | str, dict[str, Any]]:
    """The documented error answers of an OpenAI-compatible route."""
    return {s: {"model": OpenAIErrorBody, "description": _WHY[s]} for s in statuses}
