"""Validation problems in the project's words: one per field, each naming the field and the
limit it broke, so a client can show every problem of a request at once."""

from typing import Any

from pydantic import ValidationError
from pydantic_core import ErrorDetails

from shared.errors import Problem


def _number(ctx: dict[str, Any], key: str) -> str:
    value = ctx.get(key)
    return f"{value:g}" if isinstance(value, float) else str(value)


# pydantic's error type -> the sentence a person reads. Types not listed keep pydantic's own
# message, which is still specific; these are the ones a form or a hand-written body hits.
_WORDS = {
    "missing": lambda c: "is required",
    "extra_forbidden": lambda c: "is not a field of this request",
    "string_too_short": lambda c: "must not be empty" if c.get("min_length") == 1
    else f"must be at least {_number(c, 'min_length')} characters",
    "string_too_long": lambda c: f"must be at most {_number(c, 'max_length')} characters",
    "too_short": lambda c: f"needs at least {_number(c, 'min_length')} "
    f"{'entry' if c.get('min_length') == 1 else 'entries'}",
    "too_long": lambda c: f"takes at most {_number(c, 'max_length')} entries",
    "greater_than_equal": lambda c: f"must be at least {_number(c, 'ge')}",
    "greater_than": lambda c: f"must be above {_number(c, 'gt')}",
    "less_than_equal": lambda c: f"must be at most {_number(c, 'le')}",
    "less_than": lambda c: f"must be below {_number(c, 'lt')}",
    "int_parsing": lambda c: "must be a whole number",
    "int_type": lambda c: "must be a whole number",
    "int_from_float": lambda c: "must be a whole number",
    "float_parsing": lambda c: "must be a number",
    "float_type": lambda c: "must be a number",
    "finite_number": lambda c: "must be a finite number (not NaN or Infinity)",
    "string_type": lambda c: "must be a string",
    "list_type": lambda c: "must be a list",
    "dict_type": lambda c: "must be an object",
    "model_type": lambda c: "must be an object",
    "model_attributes_type": lambda c: "must be an object",
    "bool_type": lambda c: "must be true or false",
    "bool_parsing": lambda c: "must be true or false",
    "literal_error": lambda c: f"must be one of {c.get('expected')}",
    "url_parsing": lambda c: "must be an absolute http(s) URL",
    "url_scheme": lambda c: "must be an http(s) URL",
    "url_type": lambda c: "must be an absolute http(s) URL",
    "json_invalid": lambda c: f"is not valid JSON ({c.get('error')})",
}


def sentence(error: ErrorDetails) -> str:
    words = _WORDS.get(error["type"])
    if words is not None:
        return words(error.get("ctx") or {})
    if error["type"] == "value_error":
        # A validator's own ValueError: its text is already ours, behind pydantic's prefix.
        return error["msg"].removeprefix("Value error, ")
    return error["msg"]


def from_errors(errors: list[ErrorDetails], prefix: str = "") -> list[Problem]:
    """pydantic's errors as problems; `prefix` places a nested model's fields in the body."""
    out = []
    for e in errors:
        field = ".".join(str(p) for p in e["loc"])
        if prefix:
            field = f"{prefix}.{field}" if field else prefix
        out.append(Problem(field, sentence(e), e["type"]))
    return out


def from_validation_error(exc: ValidationError, prefix: str = "") -> list[Problem]:
    return from_errors(exc.errors(include_url=False), prefix)
