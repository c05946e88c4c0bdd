"""A real API process (services/api/serve.py under uvicorn) writes every line in the one format
of shared/logs.py, naming itself `api`, and one line per request at INFO
(services/api/access_log.py): method, path, status, duration. Probes log at DEBUG."""

import json
import re
import time
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest

from tests.api.live_api import live_api

LINE = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z (DEBUG|INFO|WARNING|ERROR|CRITICAL) "
                  r"(?P<process>[\w-]+)\[(?P<pid>\d+)\] (?P<logger>\S+): (?P<message>.*)$")
TS = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z$")


def _log_of(base: str, workdir: Path) -> Path:
    return workdir / f"api-{base.rsplit(':', 1)[1]}.log"


def _until(log: Path, found: Callable[[str], bool], timeout: float = 10) -> str:
    deadline = time.monotonic() + timeout
    while not found(text := log.read_text()):
        assert time.monotonic() < deadline, text[-4000:]
        time.sleep(0.05)
    return text


@pytest.mark.parametrize("log_format", ["text", "json"])
def test_the_api_logs_each_request_in_the_one_format(redis_url, model_dir, tmp_path,
                                                     log_format):
    env = {"FIBERMILL_LOG_LEVEL": "INFO", "FIBERMILL_LOG_FORMAT": log_format,
           "FIBERMILL_READY_REQUIRES_WORKERS": "false"}
    with live_api(redis_url, model_dir, tmp_path, env) as base:
        log = _log_of(base, tmp_path)
        assert httpx.get(f"{base}/v1/models").status_code == 200
        assert httpx.get(f"{base}/v1/jobs/nope").status_code == 404
        text = _until(log, lambda t: "/v1/jobs/nope" in t)
    lines = text.splitlines()
    if log_format == "json":
        entries = [json.loads(line) for line in lines]  # every line is one JSON object
        assert all(TS.match(e["ts"]) and e["process"] == "api" for e in entries)
        access = [e for e in entries if e["logger"] == "fibermill.access"]
        models, missing = access
        assert (models["level"], models["method"], models["path"], models["status"]) == (
            "INFO", "GET", "/v1/models", 200)
        assert missing["path"] == "/v1/jobs/nope" and missing["status"] == 404
        assert models["duration_ms"] >= 0 and models["client"].startswith("127.0.0.1:")
        return
    records = [LINE.match(line) for line in lines if not line.startswith(" ")]
    assert all(records), [line for line in lines if not LINE.match(line)]
    assert {r["process"] for r in records if r} == {"api"}
    access = [r.group(0) for r in records if r and r["logger"] == "fibermill.access"]
    # /healthz, polled until the API answered, is a probe: DEBUG, not shown at INFO.
    assert len(access) == 2, access
    assert re.search(r" INFO api\[\d+\] fibermill\.access: GET /v1/models 200 [\d.]+ms "
                     r"127\.0\.0\.1:\d+$", access[0]), access
    assert re.search(r"GET /v1/jobs/nope 404 [\d.]+ms", access[1]), access
