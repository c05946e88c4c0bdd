"""The input file of a batch: JSONL, one request a line.

Each non-empty line is a JSON object `{"custom_id", "method": "POST", "url", "body"}`: a
`custom_id` string unique in the file, `url` one of the text endpoints (either of them, whatever
the batch's `endpoint`: a Fibermill extension), `body` an object (what that endpoint takes;
checked when the line runs). An upload is checked line by line and refused with every problem
found (up to MAX_PROBLEMS), each naming its line number.

The driver keeps a batch's input as bytes with the offsets of its requests (`index`) and
parses a line only when it needs it, so a large batch costs its size in memory, not the size of
its parsed JSON."""

import json
from dataclasses import dataclass
from typing import Any

from services.api.openai.translate import BATCH_ENDPOINTS
from shared.errors import InvalidInput, Problem

MAX_REQUESTS = 50_000  # as OpenAI's
MAX_PROBLEMS = 20
MAX_CUSTOM_ID_CHARS = 512


@dataclass(frozen=True)
class Span:
    """Where one request is in the file: its line number (1-based) and byte range."""

    line: int
    start: int
    end: int


@dataclass(frozen=True)
class Line:
    line: int
    custom_id: str
    url: str
    body: dict[str, Any]


def index(content: bytes) -> list[Span]:
    """The non-empty lines, in order: request i of the batch is `index(content)[i]`."""
    spans = []
    start = 0
    for number, raw in enumerate(content.split(b"\n"), start=1):
        end = start + len(raw)
        if raw.strip():
            spans.append(Span(number, start, end))
        start = end + 1
    return spans


def read(content: bytes, span: Span) -> Line:
    """The request at `span` of a file that `check` accepted."""
    obj = json.loads(content[span.start:span.end])
    return Line(span.line, obj["custom_id"], obj["url"], obj["body"])


def check(content: bytes) -> int:
    """The number of requests in a batch input file; InvalidInput (field `file`) listing the
    problems, each with its line number, when it is not one."""
    problems: list[str] = []
    first_seen: dict[str, int] = {}
    spans = index(content)
    for span in spans:
        why = _line_problem(content[span.start:span.end], span.line, first_seen)
        if why is not None:
            problems.append(f"line {span.line}: {why}")
            if len(problems) >= MAX_PROBLEMS:
                problems.append(f"(stopped after {MAX_PROBLEMS} problems)")
                break
    if not spans:
        problems.append("the file has no requests (one JSON object a line)")
    if len(spans) > MAX_REQUESTS:
        problems.append(f"{len(spans)} requests: a batch has at most {MAX_REQUESTS}")
    if problems:
        raise InvalidInput.of(Problem("file", p) for p in problems)
    return len(spans)


def _line_problem(raw: bytes, number: int, first_seen: dict[str, int]) -> str | None:
    try:
        obj = json.loads(raw)
    except UnicodeDecodeError:
        return "not UTF-8 text"
    except ValueError as exc:
        return f"not valid JSON ({exc})"
    if not isinstance(obj, dict):
        return f"a JSON object is expected, not {_kind(obj)}"
    custom_id = obj.get("custom_id")
    if not isinstance(custom_id, str) or not custom_id:
        return "custom_id must be a non-empty string"
    if len(custom_id) > MAX_CUSTOM_ID_CHARS:
        return f"custom_id is longer than {MAX_CUSTOM_ID_CHARS} characters"
    if custom_id in first_seen:
        return f"custom_id {custom_id!r} appears again (first on line {first_seen[custom_id]})"
    first_seen[custom_id] = number
    if obj.get("method") != "POST":
        return f"method must be \"POST\", not {json.dumps(obj.get('method'))}"
    url = obj.get("url")
    if url not in BATCH_ENDPOINTS:
        return f"url must be one of {', '.join(BATCH_ENDPOINTS)}, not {json.dumps(url)}"
    if not isinstance(obj.get("body"), dict):
        return f"body must be a JSON object, not {_kind(obj.get('body'))}"
    extra = sorted(set(obj) - {"custom_id", "method", "url", "body"})
    if extra:
        return f"unknown field {extra[0]!r} (a line has custom_id, method, url and body)"
    return None


def _kind(value: Any) -> str:
    if value is None:
        return "null"
    return {dict: "an object", list: "an array", str: "a string", bool: "a boolean",
            int: "a number", float: "a number"}.get(type(value), type(value).__name__)
