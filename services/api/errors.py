"""The one place where domain errors become HTTP responses."""

import logging
import math
from typing import Any

from fastapi import FastAPI, Request
from fastapi.encoders import jsonable_encoder
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from services.api.openai.errors import (
    error_body,
    invalid_request,
    openai_error,
    speaks_both,
    speaks_openai,
)
from shared.errors import (
    Expired,
    FibermillError,
    IdempotencyConflict,
    InvalidInput,
    InvalidTransition,
    JobNotFound,
    ModelNotFound,
    OutputNotFound,
    PayloadTooLarge,
    RateLimited,
    ServiceUnavailable,
    Unauthorized,
    WaitTimedOut,
    WebhookSecretNotRotatable,
)
from shared.inputs import validate_input
from shared.problems import sentence

log = logging.getLogger(__name__)

STATUS = {
    Unauthorized: 401,
    IdempotencyConflict: 409,
    PayloadTooLarge: 413,
    RateLimited: 429,
    InvalidInput: 422,
    Expired: 410,
    JobNotFound: 404,
    ModelNotFound: 404,
    OutputNotFound: 404,
    InvalidTransition: 409,
    WebhookSecretNotRotatable: 409,
    ServiceUnavailable: 503,
    WaitTimedOut: 504,
}


def _status(exc: FibermillError) -> int:
    for cls in type(exc).__mro__:
        if cls in STATUS:
            return STATUS[cls]
    return 500


def render(exc: FibermillError, path: str = "") -> tuple[int, dict[str, Any], dict[str, str]]:
    """A domain error as an HTTP answer: (status, JSON body, headers), in OpenAI's format on
    its paths. Used by the exception handler below and by middleware that answers before the
    app runs (body_limit)."""
    status = _status(exc)
    body: dict[str, Any]
    if speaks_openai(path):
        status, body = openai_error(exc, status, path)
    elif isinstance(exc, InvalidInput):
        # The same shape as FastAPI's own validation errors, so clients parse one format.
        body = {"detail": [{"loc": ["body", *p.field.split(".")], "msg": p.message,
                            "type": p.code} for p in exc.problems]}
    else:
        body = {"detail": str(exc), "code": exc.code}
    if speaks_both(path):
        body |= openai_error(exc, status, path)[1]
    headers: dict[str, str] = {}
    if isinstance(exc, RateLimited | ServiceUnavailable):
        headers["Retry-After"] = str(max(1, int(exc.retry_after)))
    elif isinstance(exc, Unauthorized):
        headers["WWW-Authenticate"] = "Bearer"
    return status, body, headers


async def _domain_error(request: Request, exc: FibermillError) -> JSONResponse:
    status, body, headers = render(exc, request.url.path)
    return JSONResponse(body, status_code=status, headers=headers or None)


async def _invalid_request(request: Request, exc: RequestValidationError) -> JSONResponse:
    # FastAPI's own answer in the project's words, every problem at once; values JSON cannot
    # carry (NaN, Infinity) are echoed as text: its default handler fails to encode them and
    # answers 500.
    if speaks_openai(request.url.path):
        return JSONResponse(invalid_request(exc.errors(), exc.body), status_code=400)
    errors = []
    for e in exc.errors():
        e = {**e, "msg": sentence(e)}
        e.pop("url", None)
        if "input" in e:
            e["input"] = _json_safe(e["input"])
        errors.append(e)
    errors += _input_problems(request, exc.body)
    return JSONResponse({"detail": jsonable_encoder(errors)}, status_code=422)


def _input_problems(request: Request, body: Any) -> list[dict[str, Any]]:
    """A job refused for its envelope (a priority out of range) before its input was read:
    the input's problems too, where the model is known, so that a refusal names every problem
    at once and not the envelope's alone."""
    registry = getattr(request.app.state, "registry", None)
    if (request.url.path != "/v1/jobs" or registry is None or not isinstance(body, dict)
            or not isinstance(body.get("input"), dict)):
        return []
    model = body.get("model")
    spec = registry.models.get(model) if isinstance(model, str) else None
    if spec is None:
        return []
    try:
        validate_input(spec, body["input"])
    except InvalidInput as exc:
        return [{"loc": ["body", *p.field.split(".")], "msg": p.message, "type": p.code}
                for p in exc.problems]
    return []


def _json_safe(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    if isinstance(value, dict):
        return {k: _json_safe(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_json_safe(v) for v in value]
    return value


async def _redis_down(request: Request, exc: Exception) -> JSONResponse:
    log.warning("redis unavailable: %s", exc)
    message = "the job store is unavailable; retry shortly"
    body: dict[str, Any] = {"detail": message, "code": "unavailable"}
    if speaks_openai(request.url.path):
        body = error_body(message, "server_error", code="unavailable")
    elif speaks_both(request.url.path):
        body |= error_body(message, "server_error", code="unavailable")
    return JSONResponse(
        body,
        status_code=503,
        headers={"Retry-After": "5"},
    )


def install(app: FastAPI) -> None:
    # Starlette types every handler as taking any Exception, though it calls each only with
    # the class it is registered for.
    app.add_exception_handler(FibermillError, _domain_error)  # type: ignore[arg-type]
    app.add_exception_handler(RequestValidationError, _invalid_request)  # type: ignore[arg-type]
    app.add_exception_handler(RedisConnectionError, _redis_down)
    app.add_exception_handler(RedisTimeoutError, _redis_down)
