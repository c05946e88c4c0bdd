"""The OpenAPI document: every error answer with its body, an example request per task, and
the task inputs the job request's `input` takes."""

from typing import Any

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi
from pydantic import BaseModel, Field

from shared.inputs import INPUTS


class ErrorBody(BaseModel):
    """Every error answer other than a validation error."""

    detail: str = Field(description="What went wrong, for a person")
    code: str = Field(description="A stable, machine-readable reason")


class FieldProblem(BaseModel):
    loc: list[str | int] = Field(description=(
        'Where the problem is: "body" then the field\'s path, such as ["body", "input", '
        '"width"] or ["body", "input", "prompts", 1]'))
    msg: str = Field(description="What is wrong, naming the limit it breaks")
    type: str = Field(description="A stable, machine-readable kind of problem")


class ValidationErrorBody(BaseModel):
    """Every problem of the request at once, one entry per field."""

    detail: list[FieldProblem] = Field(description="One entry per problem")


def _error(description: str, code: str, detail: str,
           headers: dict[str, str] | None = None) -> dict[str, Any]:
    answer: dict[str, Any] = {
        "model": ErrorBody, "description": description,
        "content": {"application/json": {"example": {"detail": detail, "code": code}}},
    }
    if headers:
        answer["headers"] = {name: {"description": why, "schema": {"type": "string"}}
                             for name, why in headers.items()}
    return answer


ERRORS: dict[int, dict[str, Any]] = {
    401: _error("No API key, or one this deployment does not know (when keys are on)",
                "unauthorized", "missing or unknown API key",
                {"WWW-Authenticate": "Bearer"}),
    404: _error("No such job (or it belongs to another API key), or no such output",
                "not_found", "job 3f2a... not found"),
    410: _error("The job's record, or the output, has expired: its retention "
                "(FIBERMILL_FINISHED_JOB_TTL_SECONDS for records, FIBERMILL_OUTPUT_TTL_SECONDS "
                "for outputs) has ended", "expired",
                "output 0 of job 0192... has expired: outputs are kept for 7 days after their "
                "job was made (FIBERMILL_OUTPUT_TTL_SECONDS)"),
    409: _error("The Idempotency-Key was used with a different body, or a request with it is "
                "still being processed", "idempotency_conflict",
                "Idempotency-Key was used with a different request body"),
    413: _error("The body is larger than FIBERMILL_MAX_BODY_BYTES", "payload_too_large",
                "request body is larger than 1048576 bytes"),
    422: {
        "model": ValidationErrorBody,
        "description": "The request breaks the model's or the server's limits: every problem "
                       "at once, each naming its field",
        "content": {"application/json": {"example": {"detail": [
            {"loc": ["body", "input", "steps"], "msg": "5000 is above model digits's limit "
             "of 1000", "type": "above_limit"},
            {"loc": ["body", "input", "width"], "msg": "must be 16 for model digits",
             "type": "outside_range"},
        ]}}},
    },
    429: _error("Rate limited (per API key), or too many open event streams; retry after "
                "Retry-After seconds", "rate_limited", "rate limit exceeded; retry in 2 s",
                {"Retry-After": "Seconds to wait before retrying"}),
    503: _error("The model's queue is full, or the job store is unreachable; retry after "
                "Retry-After seconds", "unavailable",
                "model digits has 5000 sub-requests waiting; retry later",
                {"Retry-After": "Seconds to wait before retrying"}),
}


def errors(*statuses: int) -> dict[int | str, dict[str, Any]]:
    """The documented error answers of a route."""
    return {status: ERRORS[status] for status in statuses}


JOB_EXAMPLES = {
    "text": {
        "summary": "Text generation",
        "description": "Two prompts, greedy, up to 32 new tokens each; the task is inferred.",
        "value": {"model": "pydoc-gpt2", "input": {
            "prompts": ["Return the number of items", "Open the file"], "max_new_tokens": 32}},
    },
    "text-sampled": {
        "summary": "Text generation, sampled, with a stop string",
        "value": {"task": "text-generation", "model": "pydoc-gpt2", "input": {
            "prompts": ["Convert a string"], "temperature": 0.8, "top_p": 0.95,
            "stop": ["\n\n"], "seed": 7}},
    },
    "image": {
        "summary": "Image generation",
        "description": "Three digits, two images each, 50 steps, with a webhook when done.",
        "value": {"task": "image-generation", "model": "digits", "input": {
            "prompts": ["3", "eight", "a handwritten 0"], "num_images_per_prompt": 2,
            "steps": 50, "seed": 7}, "webhook": "https://example.com/hooks/fibermill"},
    },
}


def install(app: FastAPI) -> None:
    """Build the document once, with the task inputs as named schemas that the job request's
    `input` refers to (the route takes `input` as an object and checks it once the model,
    and so the task, is known)."""

    def openapi() -> dict[str, Any]:
        if app.openapi_schema:
            return app.openapi_schema
        doc = get_openapi(title=app.title, version=app.version, description=app.description,
                          routes=app.routes, tags=app.openapi_tags)
        schemas = doc["components"]["schemas"]
        refs = []
        for task, model in INPUTS.items():
            schema = model.model_json_schema(ref_template="#/components/schemas/{model}")
            schema["description"] = f"The input of a {task} job. " + schema.get("description", "")
            schemas[model.__name__] = schema
            refs.append({"$ref": f"#/components/schemas/{model.__name__}"})
        schemas["JobRequest"]["properties"]["input"]["anyOf"] = refs
        _one_validation_body(doc)
        app.openapi_schema = doc
        return doc

    # FastAPI's documented way to replace the schema, which its types declare a method.
    app.openapi = openapi  # type: ignore[method-assign]


def _one_validation_body(doc: dict[str, Any]) -> None:
    """FastAPI documents its default 422 wherever a route has parameters: point those at the
    body this API sends (the same shape, in the project's words)."""
    default = "#/components/schemas/HTTPValidationError"
    for operations in doc["paths"].values():
        for op in operations.values():
            answer = op.get("responses", {}).get("422")
            if answer and answer["content"]["application/json"]["schema"] == {"$ref": default}:
                op["responses"]["422"] = {
                    "description": ERRORS[422]["description"],
                    "content": {"application/json": {
                        "schema": {"$ref": "#/components/schemas/ValidationErrorBody"}}},
                }
    for name in ("HTTPValidationError", "ValidationError"):
        doc["components"]["schemas"].pop(name, None)
