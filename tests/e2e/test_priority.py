"""Priorities end to end: on one worker that runs one sub-request at a time, a priority-0 job
submitted after 50 priority-9 jobs overtakes (nearly) all of them."""

import time
from datetime import datetime

import httpx
import pytest
import redis

from services.devstack.processes import start_api, start_workers, stop
from services.devstack.redis_server import free_port

pytestmark = pytest.mark.e2e

LOW_JOBS = 50
FINAL = {"succeeded", "failed", "canceled"}


def _digits(priority: int, steps: int) -> dict:
    return {"task": "image-generation", "model": "digits", "priority": priority,
            "input": {"prompts": ["3"], "steps": steps, "seed": 1}}


class SingleSlot:
    """The API now, and on demand ONE CPU worker with concurrency 1, so sub-requests run
    strictly one at a time."""

    def __init__(self, redis_url: str, model_dir, logs) -> None:
        self.env = {
            "FIBERMILL_REDIS_URL": redis_url,
            "FIBERMILL_MODEL_REGISTRY": str(model_dir / "registry.yaml"),
            "FIBERMILL_CPU_WORKERS": "1",
            "FIBERMILL_WORKER_CONCURRENCY": "1",
            "FIBERMILL_WORKER_MODELS": "digits",  # loads in seconds
            "FIBERMILL_WORKER_METRICS_PORT": str(free_port()),
            "FIBERMILL_RATE_LIMIT_BURST": "1000",
            "FIBERMILL_LOG_LEVEL": "WARNING",
            # One thread: the model is tiny, and a spinning thread pool on a busy 2-core host
            # costs far more than it gains.
            "OMP_NUM_THREADS": "1",
        }
        self.redis = redis.Redis.from_url(redis_url)
        self.logs = logs
        self.logfiles = []
        self.procs = []
        self.base = f"http://127.0.0.1:{free_port()}"
        self.http = httpx.Client(base_url=self.base, timeout=30)

    def _log(self, name: str):
        f = open(self.logs / f"{name}.log", "w")  # noqa: SIM115
        self.logfiles.append(f)
        return {"stdout": f, "stderr": f}

    def start_api(self) -> None:
        port = int(self.base.rsplit(":", 1)[1])
        self.procs.append(start_api(port, self.env, **self._log("api")))
        deadline = time.monotonic() + 60
        while True:
            try:
                if self.http.get("/healthz").status_code == 200:
                    return
            except httpx.TransportError:
                pass
            if time.monotonic() > deadline or self.procs[0].poll() is not None:
                raise AssertionError(f"API did not start:\n{self.tail()}")
            time.sleep(0.1)

    def start_workers(self) -> None:
        self.procs.append(start_workers(self.env, **self._log("workers")))

    def tail(self) -> str:
        return "\n".join(p.read_text()[-4000:] for p in sorted(self.logs.glob("*.log")))

    def close(self) -> None:
        self.http.close()
        stop(self.procs)
        for f in self.logfiles:
            f.close()


@pytest.fixture
def single_slot(redis_server, model_dir, tmp_path_factory):
    redis.Redis.from_url(redis_server.url).flushdb()
    slot = SingleSlot(redis_server.url, model_dir, tmp_path_factory.mktemp("priority-logs"))
    try:
        slot.start_api()
        yield slot
    finally:
        slot.close()


def _submit(http: httpx.Client, body: dict) -> str:
    r = http.post("/v1/jobs", json=body)
    assert r.status_code == 202, r.text
    return r.json()["id"]


def _wait(http: httpx.Client, job_id: str, deadline: float) -> dict:
    while True:
        job = http.get(f"/v1/jobs/{job_id}").json()
        if job["status"] in FINAL:
            return job
        assert time.monotonic() < deadline, f"job {job_id} not final in time: {job}"
        time.sleep(0.05)


def _done_at(job: dict) -> datetime:
    assert job["status"] == "succeeded", job
    return datetime.fromisoformat(job["completed_at"])


def test_priority_0_overtakes_queued_priority_9_jobs(single_slot):
    http = single_slot.http
    # Everything is queued before the worker starts, so what runs first is the broker's
    # choice alone, not a race between submitting and consuming.
    low = [_submit(http, _digits(9, steps=20)) for _ in range(LOW_JOBS)]
    high = _submit(http, _digits(0, steps=20))
    queued = {k.decode(): single_slot.redis.llen(k)
              for k in single_slot.redis.scan_iter(match="fibermill.digits*")}
    assert queued == {"fibermill.digits:9": LOW_JOBS, "fibermill.digits": 1}

    single_slot.start_workers()
    deadline = time.monotonic() + 150  # about 25 s on an idle 2-core host
    high_done = _done_at(_wait(http, high, deadline))
    lows_done = [_done_at(_wait(http, j, deadline)) for j in low]
    overtaken = sum(t > high_done for t in lows_done)
    assert overtaken >= 40, f"the priority-0 job finished after {LOW_JOBS - overtaken} of them"
