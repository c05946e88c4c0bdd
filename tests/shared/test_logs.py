"""The one log format (shared/logs.py), in this process: text lines name the process with one
timestamp format, tracebacks indented under their record; JSON lines parse, with a record's
fields; records of loggers a library gave handlers of their own go through it too."""

import io
import json
import logging
import re
from collections.abc import Iterator

import pytest

from shared import logs
from shared.settings import get_settings

# ISO 8601 UTC with milliseconds, level, process[pid], logger: message.
LINE = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z (DEBUG|INFO|WARNING|ERROR|CRITICAL) "
                  r"(?P<process>[\w-]+)\[(?P<pid>\d+)\] (?P<logger>\S+): (?P<message>.*)$")
TS = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z$")


@pytest.fixture
def stderr() -> Iterator[io.StringIO]:
    """A stream for the handler `configure` installs; the root logger, the routed loggers and
    warnings capture as they were afterwards."""
    out = io.StringIO()
    root = logging.getLogger()
    saved = (list(root.handlers), root.level,
             {n: (list(logging.getLogger(n).handlers), logging.getLogger(n).propagate)
              for n in logs.ROUTED})
    yield out
    root.handlers[:] = saved[0]
    root.setLevel(saved[1])
    for name, (handlers, propagate) in saved[2].items():
        logging.getLogger(name).handlers[:] = handlers
        logging.getLogger(name).propagate = propagate
    logging.captureWarnings(False)
    get_settings.cache_clear()


def test_timestamp_is_iso_utc_with_milliseconds() -> None:
    assert logs.timestamp(0.5) == "1970-01-01T00:00:00.500Z"
    assert logs.timestamp(1_796_612_104.0789) == "2026-12-07T02:55:04.078Z"


def test_a_text_line_names_the_process_and_indents_its_traceback(stderr) -> None:
    logs.configure("worker-cpu0", level="INFO", log_format="text", stream=stderr)
    log = logging.getLogger("fibermill.test")
    log.debug("not at INFO")
    log.info("hello %s", "there", extra=logs.fields(job_id="j1"))
    try:
        raise ValueError("boom")
    except ValueError:
        log.exception("it failed")
    lines = stderr.getvalue().splitlines()
    first = LINE.match(lines[0])
    assert first and first["process"] == "worker-cpu0" and first["logger"] == "fibermill.test"
    assert first["message"] == "hello there" and int(first["pid"]) > 0
    assert LINE.match(lines[1]) and lines[1].endswith("it failed")
    # Every line after a record's first is indented: column 0 always starts a record.
    assert lines[2:] and all(line.startswith("    ") for line in lines[2:])
    assert "ValueError: boom" in lines[-1]
    assert "not at INFO" not in stderr.getvalue()


def test_a_json_line_parses_with_the_records_fields(stderr) -> None:
    logs.configure("api", level="DEBUG", log_format="json", stream=stderr)
    log = logging.getLogger("fibermill.test")
    log.debug("a %s", "detail", extra=logs.fields(job_id="j1", status="failed", level="x"))
    try:
        raise KeyError("k")
    except KeyError:
        log.error("broke", exc_info=True)
    first, second = (json.loads(line) for line in stderr.getvalue().splitlines())
    assert TS.match(first["ts"]) and first["level"] == "DEBUG" and first["process"] == "api"
    assert first["logger"] == "fibermill.test" and first["message"] == "a detail"
    assert first["job_id"] == "j1" and first["status"] == "failed"
    assert isinstance(first["pid"], int)
    assert second["level"] == "ERROR" and "KeyError: 'k'" in second["exc"]


def test_level_and_format_come_from_the_settings(stderr, monkeypatch) -> None:
    monkeypatch.setenv("FIBERMILL_LOG_LEVEL", "warning")
    monkeypatch.setenv("FIBERMILL_LOG_FORMAT", "JSON")
    get_settings.cache_clear()
    logs.configure("launcher", stream=stderr)
    logging.getLogger("fibermill.test").info("quiet")
    logging.getLogger("fibermill.test").warning("loud")
    (line,) = stderr.getvalue().splitlines()
    assert json.loads(line)["message"] == "loud"


def test_libraries_own_handlers_give_way_to_the_one_format(stderr) -> None:
    # What uvicorn's dictConfig or Celery's set-up would have installed.
    foreign = logging.StreamHandler(io.StringIO())
    foreign.setFormatter(logging.Formatter("[%(asctime)s: %(levelname)s] %(message)s"))
    logging.getLogger("uvicorn.error").addHandler(foreign)
    logging.getLogger("uvicorn.error").propagate = False
    logging.getLogger("celery").addHandler(foreign)
    logs.configure("api", level="INFO", log_format="text", stream=stderr)
    logging.getLogger("uvicorn.error").info("Started server process")
    logging.getLogger("celery.worker").info("celery@host ready.")
    lines = stderr.getvalue().splitlines()
    records = [LINE.match(line) for line in lines]
    assert [r["logger"] if r else line for r, line in zip(records, lines, strict=True)] == [
        "uvicorn.error", "celery.worker"]
    assert foreign.stream.getvalue() == ""
