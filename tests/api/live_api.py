"""An API replica as a real process (uvicorn) on a free port, for tests whose requests must
arrive at once, which an in-process TestClient serialises."""

import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path

import httpx

from services.devstack.processes import start_api, stop
from services.devstack.redis_server import free_port


@contextmanager
def live_api(redis_url: str, model_dir: Path, workdir: Path,
             env: Mapping[str, str]) -> Iterator[str]:
    """The API's base URL once it answers /healthz; `env` is added to its settings."""
    port = free_port()
    full_env = {
        "FIBERMILL_REDIS_URL": redis_url,
        "FIBERMILL_MODEL_REGISTRY": str(model_dir / "registry.yaml"),
        "FIBERMILL_BLOB_DIR": str(workdir / "blobs"),
        "FIBERMILL_LOG_LEVEL": "WARNING",
        **env,
    }
    base = f"http://127.0.0.1:{port}"
    log_path = workdir / f"api-{port}.log"
    with open(log_path, "w") as log:
        proc = start_api(port, full_env, stdout=log, stderr=log)
        try:
            deadline = time.monotonic() + 60
            while True:
                try:
                    if httpx.get(f"{base}/healthz").status_code == 200:
                        break
                except httpx.TransportError:
                    pass
                assert proc.poll() is None and time.monotonic() < deadline, (
                    log_path.read_text()[-4000:])
                time.sleep(0.1)
            yield base
        finally:
            stop([proc])
