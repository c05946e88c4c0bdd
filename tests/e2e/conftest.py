"""A real stack for end-to-end tests: the API under uvicorn and the worker launcher with two
CPU worker processes, as subprocesses, on the tests' own Redis."""

import contextlib
import time
from pathlib import Path

import httpx
import pytest
import redis

from services.devstack.processes import start_api, start_workers, stop, wait_ready
from services.devstack.redis_server import free_port, free_ports

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


@contextlib.contextmanager
def launch_stack(env: dict, log_dir: Path, apis: int = 1, workers: int = 1):
    """Start `apis` API processes and the worker launcher on `env`; yield a Stack whose
    second client talks to the second API (or the first, when there is one)."""
    ports = [free_port() for _ in range(apis)]
    logfiles = [open(log_dir / f"{n}.log", "w")  # noqa: SIM115 - closed below
                for n in ["workers", *(f"api{i}" for i in range(apis))]]
    # The API and the workers share one blob store, as they would a volume or a bucket.
    env = {"FIBERMILL_BLOB_DIR": str(log_dir / "blobs"), **env}
    procs = [start_api(p, env, stdout=f, stderr=f) for p, f in zip(ports, logfiles[1:],
                                                                     strict=True)]
    procs.append(start_workers(env, stdout=logfiles[0], stderr=logfiles[0]))
    urls = [f"http://127.0.0.1:{p}" for p in ports]
    s = Stack(urls[0], env["FIBERMILL_REDIS_URL"], log_dir, urls[-1])
    try:
        try:
            for url in urls:
                wait_ready(url, timeout=240, workers=workers, procs=procs)
        except Exception:
            raise AssertionError(f"stack did not start:\n{s.logs()}") from None
        yield s
    finally:
        s.http.close()
        s.other.close()
        stop(procs)
        for f in logfiles:
            f.close()


@pytest.fixture(scope="module")
def stack(redis_server, model_dir, tmp_path_factory):
    metrics_port = free_ports(2)  # worker i serves on metrics_port + i
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
        "FIBERMILL_SWEEP_INTERVAL_SECONDS": "0.5",
        "FIBERMILL_WORKER_METRICS_PORT": str(metrics_port),
        "FIBERMILL_LOG_LEVEL": "WARNING",
    }
    # Two API replicas: jobs submitted to one are read from, and joined by, either.
    with launch_stack(env, tmp_path_factory.mktemp("stack-logs"), apis=2, workers=2) as s:
        s.worker_metrics_port = metrics_port
        yield s
