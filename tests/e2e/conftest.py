"""A real stack for end-to-end tests: the API under uvicorn and the worker launcher with two
CPU worker processes, as subprocesses, on the tests' own Redis."""

import time
from pathlib import Path

import httpx
import pytest
import redis

from services.devstack.processes import start_api, start_workers, stop, wait_ready
from services.devstack.redis_server import free_port

FINAL = {"succeeded", "failed", "canceled"}


class Stack:
    def __init__(self, base_url: str, redis_url: str, log_dir: Path, other_url: str) -> None:
        self.base_url = base_url
        # A second API replica: jobs submitted to one can be read, and are joined, by either.
        self.other = httpx.Client(base_url=other_url, timeout=30)
        self.redis_url = redis_url
        self.redis = redis.Redis.from_url(redis_url)
        self.http = httpx.Client(base_url=base_url, timeout=30)
        self.log_dir = log_dir

    def submit(self, body: dict) -> dict:
        r = self.http.post("/v1/jobs", json=body)
        assert r.status_code == 202, r.text
        return r.json()

    def wait(self, job_id: str, timeout: float = 120, client: httpx.Client | None = None) -> dict:
        client = client or self.http
        deadline = time.time() + timeout
        while time.time() < deadline:
            job = client.get(f"/v1/jobs/{job_id}").json()
            if job["status"] in FINAL:
                return job
            time.sleep(0.05)
        raise AssertionError(f"job {job_id} not final after {timeout}s: {job}")

    def run(self, body: dict, timeout: float = 120) -> dict:
        return self.wait(self.submit(body)["id"], timeout)

    def logs(self) -> str:
        return "\n".join(p.read_text()[-4000:] for p in sorted(self.log_dir.glob("*.log")))


@pytest.fixture(scope="module")
def stack(redis_server, model_dir, tmp_path_factory):
    logs = tmp_path_factory.mktemp("stack-logs")
    metrics_port = free_port()  # worker i serves on metrics_port + i
    redis.Redis.from_url(redis_server.url).flushdb()
    env = {
        "FIBERMILL_REDIS_URL": redis_server.url,
        "FIBERMILL_MODEL_REGISTRY": str(model_dir / "registry.yaml"),
        "FIBERMILL_CPU_WORKERS": "2",
        "FIBERMILL_WORKER_CONCURRENCY": "2",
        # Short leases so a killed worker's sub-requests come back within seconds.
        "FIBERMILL_LEASE_SECONDS": "3",
        "FIBERMILL_HEARTBEAT_SECONDS": "0.5",
        "FIBERMILL_JANITOR_INTERVAL_SECONDS": "0.5",
        "FIBERMILL_WORKER_HEARTBEAT_TTL_SECONDS": "3",
        "FIBERMILL_WORKER_METRICS_PORT": str(metrics_port),
        "FIBERMILL_LOG_LEVEL": "WARNING",
    }
    port, port2 = free_port(), free_port()
    logfiles = [open(logs / f"{n}.log", "w") for n in ("api", "api2", "workers")]  # noqa: SIM115
    workers = start_workers(env, stdout=logfiles[2], stderr=logfiles[2])
    api = start_api(port, env, stdout=logfiles[0], stderr=logfiles[0])
    api2 = start_api(port2, env, stdout=logfiles[1], stderr=logfiles[1])
    procs = [api, api2, workers]
    s = Stack(f"http://127.0.0.1:{port}", redis_server.url, logs, f"http://127.0.0.1:{port2}")
    try:
        wait_ready(s.base_url, timeout=240, workers=2, procs=procs)
        wait_ready(f"http://127.0.0.1:{port2}", timeout=30, workers=2, procs=procs)
    except Exception:
        stop(procs)
        raise AssertionError(f"stack did not start:\n{s.logs()}") from None
    s.worker_metrics_port = metrics_port
    yield s
    s.http.close()
    s.other.close()
    stop(procs)
    for f in logfiles:
        f.close()
