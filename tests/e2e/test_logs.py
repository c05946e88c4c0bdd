"""End to end: what a stack's logs tell an operator. Two API replicas and the worker launcher with
one CPU worker, at INFO, in text: every line of every process in the one format of
shared/logs.py, naming its process (`api`, `launcher`, `worker-cpu0`); and one job-end line per
job (shared/job_log.py), from whichever process made it final, with its fields."""

import re
import time
from pathlib import Path

import pytest
import redis

from services.devstack.redis_server import free_port
from tests.e2e.conftest import launch_stack

pytestmark = pytest.mark.e2e

LINE = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z (DEBUG|INFO|WARNING|ERROR|CRITICAL) "
                  r"(?P<process>[\w-]+)\[(?P<pid>\d+)\] (?P<logger>\S+): (?P<message>.*)$")
END = re.compile(r"job (?P<id>\S+) (?P<status>\w+): model=(?P<model>\S+) task=(?P<task>\S+) "
                 r"queued=(?P<queued>[\d.]+)s running=(?P<running>[\d.]+)s "
                 r"total=(?P<total>[\d.]+)s(?: error=(?P<error>\w+))?$")


@pytest.fixture(scope="module")
def stack(redis_server, model_dir, tmp_path_factory):
    redis.Redis.from_url(redis_server.url).flushdb()
    env = {
        "FIBERMILL_REDIS_URL": redis_server.url,
        "FIBERMILL_MODEL_REGISTRY": str(model_dir / "registry.yaml"),
        "FIBERMILL_CPU_WORKERS": "1",
        "FIBERMILL_WORKER_CONCURRENCY": "2",
        # digits is in the registry, but no worker serves it: its jobs wait in the queue.
        "FIBERMILL_WORKER_MODELS": "tiny-gpt2,broken-gpt2",
        "FIBERMILL_JANITOR_INTERVAL_SECONDS": "0.5",
        "FIBERMILL_WORKER_METRICS_PORT": str(free_port()),
        "FIBERMILL_LOG_LEVEL": "INFO",
        "OMP_NUM_THREADS": "1",
    }
    with launch_stack(env, tmp_path_factory.mktemp("log-lines"), apis=2, workers=1) as s:
        yield s


def _lines(log_dir: Path) -> dict[str, list[str]]:
    return {p.stem: p.read_text().splitlines() for p in sorted(log_dir.glob("*.log"))}


def _ends(stack, job_id: str, timeout: float = 10) -> list[tuple[str, re.Match, re.Match]]:
    """(log, line, job-end message) for each job-end line of `job_id` across the stack's logs,
    once there is one (it is written just after the job became final)."""
    deadline = time.monotonic() + timeout
    while True:
        found = []
        for name, lines in _lines(stack.log_dir).items():
            for line in lines:
                record = LINE.match(line)
                if record and record["logger"] == "fibermill.jobs" and (
                        end := END.match(record["message"])) and end["id"] == job_id:
                    found.append((name, record, end))
        if found or time.monotonic() > deadline:
            return found
        time.sleep(0.1)


def test_a_one_prompt_job_ends_in_the_workers_log(stack):
    job = stack.run({"model": "tiny-gpt2", "input": {"prompts": ["Hello"], "max_new_tokens": 3}})
    assert job["status"] == "succeeded", job
    ((log, record, end),) = _ends(stack, job["id"])
    # The worker made it final, in the step that stored its one result.
    assert log == "workers" and record["process"] == "worker-cpu0"
    assert (end["model"], end["task"], end["status"], end["error"]) == (
        "tiny-gpt2", "text-generation", "succeeded", None)
    assert record.group(1) == "INFO"
    queued, running, total = (float(end[k]) for k in ("queued", "running", "total"))
    assert running > 0 and abs(queued + running - total) <= 0.002


def test_a_joined_job_ends_once_in_one_api_replicas_log(stack):
    job = stack.run({"model": "tiny-gpt2",
                     "input": {"prompts": ["a", "b", "c"], "max_new_tokens": 3}})
    assert job["status"] == "succeeded", job
    ((log, record, end),) = _ends(stack, job["id"])
    assert log.startswith("api") and record["process"] == "api"
    assert end["status"] == "succeeded" and end["model"] == "tiny-gpt2"


def test_a_failed_job_ends_at_warning_with_its_error(stack):
    job = stack.run({"model": "broken-gpt2", "input": {"prompts": ["boom"],
                                                       "max_new_tokens": 4}})
    assert job["status"] == "failed", job
    ((log, record, end),) = _ends(stack, job["id"])
    assert log.startswith("api") and record.group(1) == "WARNING"
    assert (end["status"], end["error"], end["model"]) == ("failed", "model_error",
                                                           "broken-gpt2")


def test_a_job_past_its_deadline_ends_with_deadline_exceeded(stack):
    submitted = stack.submit({"model": "digits", "input": {"prompts": ["3"]},
                              "deadline_seconds": 0.5})
    job = stack.wait(submitted["id"], timeout=30)
    assert job["status"] == "failed" and job["error"]["code"] == "deadline_exceeded", job
    ((log, record, end),) = _ends(stack, job["id"])
    assert log.startswith("api") and record["process"] == "api"
    assert (end["status"], end["error"], end["task"]) == (
        "failed", "deadline_exceeded", "image-generation")
    # It never started: all of its time was spent queued.
    assert float(end["running"]) == 0 and float(end["queued"]) >= 0.5


def test_every_process_writes_the_one_format(stack):
    assert stack.http.get("/v1/models").status_code == 200
    assert stack.other.get("/v1/models").status_code == 200
    time.sleep(0.5)  # the request line is written once the answer is sent
    logs = _lines(stack.log_dir)
    seen: dict[str, set[str]] = {}
    for name, lines in logs.items():
        # Column 0 starts a record; a traceback's lines follow indented.
        records = [LINE.match(line) for line in lines if line and not line.startswith(" ")]
        assert all(records), (name, [line for line in lines
                                     if line and not line.startswith(" ")
                                     and not LINE.match(line)][:5])
        seen[name] = {r["process"] for r in records if r}
    assert seen["api0"] == seen["api1"] == {"api"}
    assert seen["workers"] == {"launcher", "worker-cpu0"}
    assert re.search(r"INFO api\[\d+\] fibermill\.access: GET /v1/models 200 [\d.]+ms",
                     "\n".join(logs["api0"]))
    # The probes that waited for the stack to be ready are not at INFO.
    assert "/readyz" not in "\n".join(logs["api0"] + logs["api1"])
    # What the worker loaded, logged while Celery starts, before it sets up its own logging.
    assert re.search(r"INFO worker-cpu0\[\d+\] services\.worker\.runtime: loaded tiny-gpt2 ",
                     "\n".join(logs["workers"]))
