"""The input file of a batch: JSONL, one request a line.

Each non-empty line is a JSON object `{"custom_id", "method": "POST", "url", "body"}`: a
`custom_id` string unique in the file, `url` one of the text endpoints (either of them, whatever
the batch's `endpoint`: a Fibermill extension), `body` an object (what that endpoint takes;
checked when the line runs). An upload is checked line by line and refused with every problem
found (up to MAX_PROBLEMS), each naming its line number.

A file is checked a chunk at a time (checker.py), and the driver reads a batch's lines from the
blob store a window at a time by their offsets (batch_input.py), parsing a line only when it
needs it: neither holds a whole file. A line nested deeper than MAX_DEPTH is refused before it
is parsed (the parser would recurse once per level)."""

import hashlib
import json
import re
from dataclasses import dataclass
from typing import Any

from services.api.openai.translate import BATCH_ENDPOINTS

MAX_REQUESTS = 50_000  # as OpenAI's
MAX_PROBLEMS = 20
MAX_CUSTOM_ID_CHARS = 512
MAX_DEPTH = 64  # arrays and objects in one another; a request's body needs a handful
# A JSON string whole (so that brackets inside one are not counted), or one bracket.
_NESTING = re.compile(rb'"(?:[^"\\]|\\.)*"|[\[\]{}]', re.DOTALL)


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


@dataclass(frozen=True)
class Raw:
    """One request's text (its line, without the newline) and its line number."""

    line: int
    text: bytes


def read(content: bytes, span: Span) -> Line:
    """The request at `span` of a file that `line_problem` accepted line by line."""
    return parse(Raw(span.line, content[span.start:span.end]))


def parse(raw: Raw) -> Line:
    obj = json.loads(raw.text)
    return Line(raw.line, obj["custom_id"], obj["url"], obj["body"])


def too_deep(raw: bytes, limit: int = MAX_DEPTH) -> bool:
    """Whether the JSON text nests arrays and objects deeper than `limit`, found without
    recursion (and without looking further when it has too few brackets to)."""
    if raw.count(b"[") + raw.count(b"{") <= limit:
        return False
    depth = 0
    for match in _NESTING.finditer(raw):
        token = match.group()
        if token in (b"[", b"{"):
            depth += 1
            if depth > limit:
                return True
        elif token in (b"]", b"}"):
            depth -= 1
    return False


def line_problem(raw: bytes, number: int, first_seen: dict[int, int]) -> str | None:
    """What is wrong with line `number`, or None; `first_seen` (the custom_ids of the lines
    before, as ids_key makes them) gains this line's."""
    if too_deep(raw):
        return f"nested deeper than {MAX_DEPTH} levels (the most a line may nest)"
    try:
        obj = json.loads(raw)
    except UnicodeDecodeError:
        return "not UTF-8 text"
    except RecursionError:  # deeper than the parser goes, past what too_deep counts
        return f"nested deeper than {MAX_DEPTH} levels (the most a line may nest)"
    except ValueError as exc:
        return f"not valid JSON ({exc})"
    if not isinstance(obj, dict):
        return f"a JSON object is expected, not {_kind(obj)}"
    custom_id = obj.get("custom_id")
    if not isinstance(custom_id, str) or not custom_id:
        return "custom_id must be a non-empty string"
    if len(custom_id) > MAX_CUSTOM_ID_CHARS:
        return f"custom_id is longer than {MAX_CUSTOM_ID_CHARS} characters"
    key = ids_key(custom_id)
    if key in first_seen:
        return f"custom_id {custom_id!r} appears again (first on line {first_seen[key]})"
    first_seen[key] = number
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


def ids_key(custom_id: str) -> int:
    """What a file's check remembers of a custom_id: 8 bytes of its hash, not the id (up to
    MAX_CUSTOM_ID_CHARS each); two ids of one file share one with odds of about 1 in 10^10."""
    return int.from_bytes(hashlib.blake2b(custom_id.encode(), digest_size=8).digest(), "big")


def _kind(value: Any) -> str:
    if value is None:
        return "null"
    return {dict: "an object", list: "an array", str: "a string", bool: "a boolean",
            int: "a number", float: "a number"}.get(type(value), type(value).__name__)
