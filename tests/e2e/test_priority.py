"""Priorities end to end: on one worker that runs one sub-request at a time, a priority-0 job
submitted after 50 priority-9 jobs overtakes (nearly) all of them."""

import time
from datetime import datetime

import httpx
import pytest
import redis

from services.devstack.processes import start_api, start_workers, stop, wait_ready
from services.devstack.redis_server import free_port

pytestmark = pytest.mark.e2e

LOW_JOBS = 50
FINAL = {"succeeded", "failed", "canceled"}


def _digits(priority: int, steps: int) -> dict:
    return {"task": "image-generation", "model": "digits", "priority": priority,
            "input": {"prompts": ["3"], "steps": steps, "seed": 1}}


@pytest.fixture(scope="module")
def single_slot(redis_server, model_dir, tmp_path_factory):
    """The API and ONE CPU worker with concurrency 1: sub-requests run strictly one by one."""
    logs = tmp_path_factory.mktemp("priority-logs")
    redis.Redis.from_url(redis_server.url).flushdb()
    env = {
        "FIBERMILL_REDIS_URL": redis_server.url,
        "FIBERMILL_MODEL_REGISTRY": str(model_dir / "registry.yaml"),
        "FIBERMILL_CPU_WORKERS": "1",
        "FIBERMILL_WORKER_CONCURRENCY": "1",
        "FIBERMILL_WORKER_MODELS": "digits",  # loads in seconds
        "FIBERMILL_WORKER_METRICS_PORT": str(free_port()),
        "FIBERMILL_RATE_LIMIT_BURST": "1000",
        "FIBERMILL_LOG_LEVEL": "WARNING",
    }
    port = free_port()
    logfiles = [open(logs / f"{n}.log", "w") for n in ("api", "workers")]  # noqa: SIM115
    procs = [start_api(port, env, stdout=logfiles[0], stderr=logfiles[0]),
             start_workers(env, stdout=logfiles[1], stderr=logfiles[1])]
    base = f"http://127.0.0.1:{port}"
    try:
        wait_ready(base, timeout=120, workers=1, procs=procs)
    except Exception:
        stop(procs)
        text = "\n".join(p.read_text()[-4000:] for p in sorted(logs.glob("*.log")))
        raise AssertionError(f"stack did not start:\n{text}") from None
    with httpx.Client(base_url=base, timeout=30) as http:
        yield http
    stop(procs)
    for f in logfiles:
        f.close()


def _submit(http: httpx.Client, body: dict) -> str:
    r = http.post("/v1/jobs", json=body)
    assert r.status_code == 202, r.text
    return r.json()["id"]


def _wait(http: httpx.Client, job_id: str, timeout: float, status: set[str]) -> dict:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        job = http.get(f"/v1/jobs/{job_id}").json()
        if job["status"] in status:
            return job
        time.sleep(0.05)
    raise AssertionError(f"job {job_id} not {status} after {timeout}s: {job}")


def _done_at(job: dict) -> datetime:
    assert job["status"] == "succeeded", job
    return datetime.fromisoformat(job["completed_at"])


def test_priority_0_overtakes_queued_priority_9_jobs(single_slot):
    http = single_slot
    # A long low-priority job holds the only slot while the rest are queued behind it, so the
    # test does not depend on how fast the 51 submissions go.
    blocker = _submit(http, _digits(9, steps=1000))
    _wait(http, blocker, 30, {"running", *FINAL})
    low = [_submit(http, _digits(9, steps=20)) for _ in range(LOW_JOBS)]
    high = _submit(http, _digits(0, steps=20))
    assert http.get(f"/v1/jobs/{blocker}").json()["status"] == "running", "blocker too short"

    high_done = _done_at(_wait(http, high, 60, FINAL))
    lows_done = [_done_at(_wait(http, j, 60, FINAL)) for j in low]
    overtaken = sum(t > high_done for t in lows_done)
    assert overtaken >= 40, f"the priority-0 job finished after {LOW_JOBS - overtaken} of them"
