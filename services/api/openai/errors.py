"""OpenAI's error body, `{"error": {"message", "type", "param", "code"}}`, for the domain errors
of the OpenAI-compatible paths. services/api/errors.py picks this format by path, so one set of
domain errors serves both APIs.

OpenAI answers a request it cannot take with 400 (Fibermill's own API says 422); the other
statuses are the same in both."""

from collections.abc import Sequence
from typing import Any

from pydantic import BaseModel, Field

from shared.errors import (
    ContextLengthExceeded,
    Expired,
    FibermillError,
    InvalidInput,
    JobNotFound,
    ModelNotFound,
    OutputNotFound,
    PayloadTooLarge,
    QuotaExceeded,
    RateLimited,
    ServiceUnavailable,
    Unauthorized,
    WaitTimedOut,
)
from shared.problems import sentence

# Where a path starts, it speaks OpenAI.
PREFIXES = ("/v1/chat/", "/v1/completions", "/v1/images/", "/v1/files", "/v1/batches")
# /v1/models is both APIs' list of models: its answers carry both shapes, and so do its errors,
# Fibermill's `detail` and `code` beside OpenAI's `error`, so that either client reads its own.
SHARED = "/v1/models"


def speaks_openai(path: str) -> bool:
    return path.startswith(PREFIXES)


def speaks_both(path: str) -> bool:
    return path == SHARED or path.startswith(SHARED + "/")


def error_body(message: str, type: str = "invalid_request_error", param: str | None = None,
               code: str | None = None) -> dict[str, Any]:
    return {"error": {"message": message, "type": type, "param": param, "code": code}}


def invalid_request(errors: Sequence[Any], body: Any) -> dict[str, Any]:
    """The 400 body of a request FastAPI could not read into its model (`errors`: pydantic's,
    `body`: what it read): every problem at once, `param` naming the first one's field. A body
    that is not JSON names no field (pydantic's location is the character it failed at) and
    says where the JSON breaks, as a line and column an editor can go to."""
    problems: list[tuple[str | None, str]] = []
    for e in errors:
        if e["type"] == "json_invalid":
            problems.append((None, _not_json(e, body)))
            continue
        field = ".".join(str(p) for p in e["loc"][1:] if p != "body") or "body"
        problems.append((field, f"{field}: {sentence(e)}"))
    return error_body("; ".join(m for _, m in problems), param=problems[0][0])


def _not_json(error: Any, body: Any) -> str:
    reason = (error.get("ctx") or {}).get("error") or "cannot be parsed"
    pos = error["loc"][-1] if error["loc"] else None
    if not isinstance(pos, int) or not isinstance(body, str):
        return f"the request body is not valid JSON: {reason}"
    line = body.count("\n", 0, pos) + 1
    column = pos - body.rfind("\n", 0, pos)  # from 1, as json's own error counts it
    return f"the request body is not valid JSON: {reason} at line {line}, column {column}"


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
    elif isinstance(exc, ModelNotFound):
        return status, error_body(str(exc), param="model", code=exc.code)
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


class SharedErrorBody(OpenAIErrorBody):
    """An error of /v1/models, in both APIs' shapes at once."""

    detail: str = Field(description="What went wrong, for a person (Fibermill's shape)")
    code: str = Field(description="A stable, machine-readable reason (Fibermill's shape)")


_SHARED_WHY = {401: _WHY[401], 404: "No such model (model_not_found)"}


def shared_errors(*statuses: int) -> dict[int | str, dict[str, Any]]:
    """The documented error answers of a /v1/models route."""
    return {s: {"model": SharedErrorBody, "description": _SHARED_WHY[s]} for s in statuses}


def openai_errors(*statuses: int) -> dict[int | str, dict[str, Any]]:
    """The documented error answers of an OpenAI-compatible route."""
    return {s: {"model": OpenAIErrorBody, "description": _WHY[s]} for s in statuses}
