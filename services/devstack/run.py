"""`make run`: Redis (unless FIBERMILL_REDIS_URL names one), the API and the workers.

Pid files go to run/; a previous run's leftovers are stopped first. Ctrl-C stops everything
this started.
"""

import os
import signal
import sys
import time

from services.devstack.processes import start_api, start_workers, stop, wait_ready
from services.devstack.redis_server import free_port, start_redis
from shared.settings import REPO_ROOT

RUN_DIR = REPO_ROOT / "run"


def _stop_leftovers() -> None:
    for pidfile in RUN_DIR.glob("*.pid"):
        try:
            pid = int(pidfile.read_text())
            os.kill(pid, signal.SIGTERM)
            print(f"stopped leftover {pidfile.stem} (pid {pid})")
        except (ValueError, ProcessLookupError, PermissionError):
            pass
        pidfile.unlink(missing_ok=True)
    time.sleep(0.5)


def _write_pid(name: str, pid: int) -> None:
    (RUN_DIR / f"{name}.pid").write_text(str(pid))


def main() -> int:
    RUN_DIR.mkdir(exist_ok=True)
    _stop_leftovers()
    port = int(os.environ.get("FIBERMILL_API_PORT", "8000"))
    env = {"FIBERMILL_WEBHOOK_ALLOW_PRIVATE": "true"}
    procs = []
    if os.environ.get("FIBERMILL_REDIS_URL"):
        print(f"Redis:   {os.environ['FIBERMILL_REDIS_URL']} (from FIBERMILL_REDIS_URL)")
    else:
        redis_port = free_port()
        redis_proc = start_redis(redis_port, RUN_DIR / "redis", start_new_session=True)
        procs.append(redis_proc)
        _write_pid("redis", redis_proc.pid)
        env["FIBERMILL_REDIS_URL"] = f"redis://127.0.0.1:{redis_port}/0"
        print(f"Redis:   {env['FIBERMILL_REDIS_URL']} (started here, data in run/redis)")
    # Own sessions: a Ctrl-C reaches only this runner, which stops the rest in order.
    workers = start_workers(env, start_new_session=True)
    api = start_api(port, env, host=os.environ.get("FIBERMILL_API_HOST", "0.0.0.0"),
                    start_new_session=True)
    _write_pid("workers", workers.pid)
    _write_pid("api", api.pid)
    procs = [api, workers, *procs]  # stop order: API, workers, then Redis

    def shutdown(*_):
        print("\nstopping...")
        stop(procs)
        for p in RUN_DIR.glob("*.pid"):
            p.unlink(missing_ok=True)
        sys.exit(0)

    signal.signal(signal.SIGINT, shutdown)
    signal.signal(signal.SIGTERM, shutdown)
    t0 = time.time()
    base = f"http://127.0.0.1:{port}"
    try:
        wait_ready(base, timeout=600, procs=[api, workers])
    except (TimeoutError, RuntimeError) as exc:
        print(f"not ready: {exc}")
        shutdown()
    print(f"\nFibermill is ready after {time.time() - t0:.1f}s")
    print(f"  web page: {base}/")
    print(f"  API:      {base}   (docs: {base}/docs)")
    print(f"  models:   {base}/v1/models")
    print(f"  metrics:  {base}/metrics   worker metrics: http://127.0.0.1:9100/metrics")
    print("Ctrl-C stops everything.\n")
    while True:
        time.sleep(1)
        for p in procs:
            if p.poll() is not None:
                print(f"{p.args[:3]} exited with {p.returncode}; stopping")
                shutdown()


if __name__ == "__main__":
    sys.exit(main())
