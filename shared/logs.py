"""One log format for every Fibermill process: the API under uvicorn, the worker launcher and
its Celery worker children.

Each line starts with the same UTC timestamp (ISO 8601, milliseconds) and names the process
that wrote it (`api[1234]`, `launcher[1200]`, `worker-cpu0[1201]`), so the lines of a stack's
processes, interleaved in one terminal or collected side by side, read as one log:

    2026-12-07T02:55:04.123Z INFO api[1234] fibermill.access: GET /v1/models 200 3.1ms

`FIBERMILL_LOG_FORMAT=json` writes each record as one JSON object instead (`ts`, `level`,
`process`, `pid`, `logger`, `message`, the record's own fields, `exc` for a traceback), for a
collector that parses lines. `FIBERMILL_LOG_LEVEL` sets the level.
"""

import json
import logging
import sys
import time
from typing import Any, TextIO

from shared.settings import get_settings

# The attribute a record's structured fields travel in: `log.info(msg, extra=fields(...))`.
FIELDS = "fields"


def fields(**values: Any) -> dict[str, dict[str, Any]]:
    """The `extra` of a record whose values a JSON line carries as fields of their own (the
    text line has them in its message)."""
    return {FIELDS: values}


def timestamp(created: float) -> str:
    """`created` (epoch seconds) as ISO 8601 UTC with milliseconds: 2026-12-07T02:55:04.123Z."""
    millis = int(created * 1000) % 1000
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(created)) + f".{millis:03d}Z"


class TextFormatter(logging.Formatter):
    """`<timestamp> <LEVEL> <process>[<pid>] <logger>: <message>`. A traceback's lines follow
    indented, so that every line at column 0 starts a record."""

    def __init__(self, process: str) -> None:
        super().__init__()
        self.process = process

    def format(self, record: logging.LogRecord) -> str:
        line = (f"{timestamp(record.created)} {record.levelname} {self.process}"
                f"[{record.process}] {record.name}: {record.getMessage()}")
        extra = _exception(self, record)
        if extra:
            line += "\n" + "\n".join("    " + x for x in extra.splitlines())
        return line


class JsonFormatter(logging.Formatter):
    """One JSON object per record, on one line."""

    def __init__(self, process: str) -> None:
        super().__init__()
        self.process = process

    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, Any] = {
            "ts": timestamp(record.created),
            "level": record.levelname,
            "process": self.process,
            "pid": record.process,
            "logger": record.name,
            "message": record.getMessage(),
        }
        own = getattr(record, FIELDS, None)
        if isinstance(own, dict):
            entry.update({k: v for k, v in own.items() if k not in entry})
        extra = _exception(self, record)
        if extra:
            entry["exc"] = extra
        return json.dumps(entry, default=str)


def _exception(formatter: logging.Formatter, record: logging.LogRecord) -> str:
    """The record's traceback and stack, as logging.Formatter would append them."""
    parts = []
    if record.exc_info and not record.exc_text:
        record.exc_text = formatter.formatException(record.exc_info)
    if record.exc_text:
        parts.append(record.exc_text)
    if record.stack_info:
        parts.append(formatter.formatStack(record.stack_info))
    return "\n".join(parts)


# Loggers that other libraries give handlers of their own: their records go to the root's
# handler instead, in this format.
ROUTED = ("uvicorn", "uvicorn.error", "uvicorn.access", "uvicorn.asgi", "celery", "celery.task",
          "celery.redirected")


def configure(process: str, level: str | int | None = None, log_format: str | None = None,
              stream: TextIO | None = None) -> logging.Handler:
    """Send every record of this process to `stream` (stderr) in the one format, naming it
    `process`. `level` and `log_format` default to FIBERMILL_LOG_LEVEL and
    FIBERMILL_LOG_FORMAT. Calling it again replaces what an earlier call (or a library)
    installed."""
    settings = get_settings()
    chosen = log_format or settings.log_format
    handler = logging.StreamHandler(stream or sys.stderr)
    handler.setFormatter(JsonFormatter(process) if chosen == "json" else TextFormatter(process))
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(level if level is not None else settings.log_level)
    for name in ROUTED:
        routed = logging.getLogger(name)
        for old in list(routed.handlers):
            routed.removeHandler(old)
        routed.propagate = True
    # Warnings (DeprecationWarning and the like) as records, in the same format.
    logging.captureWarnings(True)
    return handler
