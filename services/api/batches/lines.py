"""The lines of a batch's output and error files, in OpenAI's format, and the `errors` of a
batch that failed validation."""

import json
from typing import Any

from services.api.batches import jsonl


def line_id(batch_id: str, line: jsonl.Line, job_id: str | None) -> str:
    return f"batch_req_{job_id}" if job_id else \
        f"batch_req_{batch_id.removeprefix('batch_')}_{line.line}"


def response_line(batch_id: str, line: jsonl.Line, status: int, body: dict[str, Any],
                  job_id: str | None = None) -> dict[str, Any]:
    return {"id": line_id(batch_id, line, job_id), "custom_id": line.custom_id,
            "response": {"status_code": status, "request_id": job_id, "body": body},
            "error": None}


def error_line(batch_id: str, line: jsonl.Line, code: str, message: str,
               request_id: str | None = None) -> dict[str, Any]:
    return {"id": line_id(batch_id, line, request_id), "custom_id": line.custom_id,
            "response": None, "error": {"code": code, "message": message}}


def line_of(message: str) -> int | None:
    if message.startswith("line "):
        number = message[5:].split(":", 1)[0]
        if number.isdigit():
            return int(number)
    return None


def validation_errors(param: str, code: str, message: str) -> str:
    return json.dumps({"object": "list", "data": [
        {"code": code, "message": message, "param": param, "line": None}]})
