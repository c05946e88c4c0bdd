"""A real worker launcher beside an in-process API (TestClient), on the tests' Redis: started
in a session of its own, so a test can freeze it (SIGSTOP) and thaw it."""

import contextlib
import time
from collections.abc import Iterator
from pathlib import Path

from fastapi.testclient import TestClient

from services.devstack.processes import start_workers, stop
from services.devstack.redis_server import free_port


@contextlib.contextmanager
def worker_process(redis_url: str, model_dir: Path, blob_dir: Path, models: str,
                   log: Path) -> Iterator[object]:
    """One CPU worker process serving `models`, one sub-request at a time."""
    env = {
        "FIBERMILL_REDIS_URL": redis_url,
        "FIBERMILL_MODEL_REGISTRY": str(model_dir / "registry.yaml"),
        "FIBERMILL_BLOB_DIR": str(blob_dir),
        "FIBERMILL_CPU_WORKERS": "1",
        "FIBERMILL_WORKER_CONCURRENCY": "1",
        "FIBERMILL_WORKER_MODELS": models,
        "FIBERMILL_WORKER_METRICS_PORT": str(free_port()),
        "FIBERMILL_LOG_LEVEL": "WARNING",
        "OMP_NUM_THREADS": "1",
    }
    with open(log, "w") as out:
        proc = start_workers(env, stdout=out, stderr=out, start_new_session=True)
        try:
            yield proc
        finally:
            stop([proc])


def wait_until_ready(client: TestClient, proc, log: Path, timeout: float = 240) -> None:
    """Until /readyz counts a live worker (its models loaded)."""
    deadline = time.monotonic() + timeout
    while client.get("/readyz").status_code != 200:
        if proc.poll() is not None or time.monotonic() > deadline:
            raise AssertionError(f"worker not ready:\n{log.read_text()[-4000:]}")
        time.sleep(0.2)


def wait_for(client: TestClient, job_id: str, statuses: set[str], headers: dict | None = None,
             timeout: float = 120) -> dict:
    """The job once its status is one of `statuses`."""
    deadline = time.monotonic() + timeout
    while (job := client.get(f"/v1/jobs/{job_id}", headers=headers).json())["status"] \
            not in statuses:
        if time.monotonic() > deadline:
            raise AssertionError(f"job {job_id} still {job['status']} after {timeout}s")
        time.sleep(0.05)
    return job
