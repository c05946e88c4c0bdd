"""`make run`: Redis (unless FIBERMILL_REDIS_URL names one), the API and the workers.

Listens on 127.0.0.1 unless FIBERMILL_API_HOST says otherwise, and prints who can reach it.
State (Redis data, pid files, a lock) lives in run/ (FIBERMILL_RUN_DIR): a second `make run`
on the same state is refused with the first one's address instead of taking it over. A
previous run's leftover processes (its runner gone) are stopped first. Ctrl-C stops everything
this started.
"""

import fcntl
import ipaddress
import os
import signal
import socket
import sys
import time
from pathlib import Path
from typing import IO

from services.devstack.processes import start_api, start_workers, stop, wait_ready
from services.devstack.redis_server import free_port, start_redis
from services.worker.launcher import plan
from shared.settings import REPO_ROOT, Settings

RUN_DIR = Path(os.environ.get("FIBERMILL_RUN_DIR", REPO_ROOT / "run"))


def _hold_lock(run_dir: Path) -> IO[str] | None:
    """The run directory's lock, held until this process ends (the kernel lets go of it even
    on SIGKILL); None when another runner holds it."""
    handle = open(run_dir / "lock", "a+")  # noqa: SIM115  (held for the process's lifetime)
    try:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        handle.seek(0)
        holder = handle.read().strip() or "another process"
        handle.close()
        print(f"another `make run` is using {run_dir}: {holder}.\n"
              "Stop it first (Ctrl-C where it runs), or start this one with its own state and "
              "port: FIBERMILL_RUN_DIR=run-2 FIBERMILL_API_PORT=8001 make run", file=sys.stderr)
        return None
    return handle


def _stop_leftovers(run_dir: Path) -> None:
    """Processes a runner that died without stopping them left behind (its lock is free)."""
    for pidfile in run_dir.glob("*.pid"):
        try:
            pid = int(pidfile.read_text())
            os.kill(pid, signal.SIGTERM)
            print(f"stopped leftover {pidfile.stem} (pid {pid})")
        except (ValueError, ProcessLookupError, PermissionError):
            pass
        pidfile.unlink(missing_ok=True)
    time.sleep(0.5)


def _port_in_use(host: str, port: int) -> bool:
    """Whether the API could not bind `host:port`, tested the way uvicorn binds it: with
    SO_REUSEADDR, so the TIME_WAIT sockets a run stopped a moment ago leaves behind do not
    count (only a listener does)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError:
            return True
    return False


def _loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def exposure(host: str, settings: Settings) -> list[str]:
    """What the banner says about who can reach this stack and what it may reach."""
    lines = []
    if _loopback(host):
        lines.append(f"listening on {host} only: this machine can reach it, the network cannot "
                     "(FIBERMILL_API_HOST=0.0.0.0 opens it)")
    else:
        lines.append(f"listening on {host}: reachable from the network")
    keys = len(settings.api_key_list)
    if keys:
        lines.append(f"API keys: on ({keys} key{'s' if keys > 1 else ''})")
    elif _loopback(host):
        lines.append("API keys: off (FIBERMILL_API_KEYS turns them on)")
    else:
        lines.append("API keys: OFF - anyone who reaches the port can submit jobs; set "
                     "FIBERMILL_API_KEYS")
    lines.append("webhooks to private addresses: " + (
        "allowed (for receivers on this machine)" if settings.webhook_allow_private
        else "refused"))
    return lines


def worker_metrics(settings: Settings) -> str:
    if not settings.worker_metrics_port:
        return "a free port per worker (FIBERMILL_WORKER_METRICS_PORT=0)"
    ports = [settings.worker_metrics_port + slot.index for slot in plan(settings)]
    return "  ".join(f"http://127.0.0.1:{p}/metrics" for p in ports) or "no workers planned"


def main() -> int:
    RUN_DIR.mkdir(parents=True, exist_ok=True)
    lock = _hold_lock(RUN_DIR)
    if lock is None:
        return 1
    port = int(os.environ.get("FIBERMILL_API_PORT", "8000"))
    host = os.environ.get("FIBERMILL_API_HOST", "127.0.0.1")
    _stop_leftovers(RUN_DIR)
    if _port_in_use(host, port):
        print(f"port {port} on {host} is in use: set FIBERMILL_API_PORT to a free one",
              file=sys.stderr)
        return 1
    base = f"http://127.0.0.1:{port}" if host in ("0.0.0.0", "::") else f"http://{host}:{port}"
    lock.truncate(0)
    lock.write(f"runner pid {os.getpid()}, API at {base}\n")
    lock.flush()
    # Private webhook targets (a receiver on this machine) only while nothing else can reach
    # the API; set FIBERMILL_WEBHOOK_ALLOW_PRIVATE to decide otherwise.
    private = os.environ.get("FIBERMILL_WEBHOOK_ALLOW_PRIVATE", str(_loopback(host)).lower())
    env = {"FIBERMILL_WEBHOOK_ALLOW_PRIVATE": private,
           "FIBERMILL_BLOB_DIR": os.environ.get("FIBERMILL_BLOB_DIR", str(RUN_DIR / "blobs"))}
    settings = Settings(webhook_allow_private=private)
    procs = []
    if os.environ.get("FIBERMILL_REDIS_URL"):
        print(f"Redis:   {os.environ['FIBERMILL_REDIS_URL']} (from FIBERMILL_REDIS_URL)")
    else:
        redis_port = free_port()
        redis_proc = start_redis(redis_port, RUN_DIR / "redis", start_new_session=True)
        procs.append(redis_proc)
        _write_pid("redis", redis_proc.pid)
        env["FIBERMILL_REDIS_URL"] = f"redis://127.0.0.1:{redis_port}/0"
        print(f"Redis:   {env['FIBERMILL_REDIS_URL']} (started here, data in {RUN_DIR}/redis)")
    # Own sessions: a Ctrl-C reaches only this runner, which stops the rest in order.
    workers = start_workers(env, start_new_session=True)
    api = start_api(port, env, host=host, start_new_session=True)
    _write_pid("workers", workers.pid)
    _write_pid("api", api.pid)
    procs = [api, workers, *procs]  # stop order: API, workers, then Redis
    stopping = False

    def shutdown(*_):
        nonlocal stopping
        if stopping:  # a second Ctrl-C while stopping: the stop in progress finishes
            return
        stopping = True
        print("\nstopping...")
        stop(procs)
        for p in RUN_DIR.glob("*.pid"):
            p.unlink(missing_ok=True)
        sys.exit(0)

    signal.signal(signal.SIGINT, shutdown)
    signal.signal(signal.SIGTERM, shutdown)
    t0 = time.time()
    try:
        wait_ready(base, timeout=600, procs=[api, workers])
    except (TimeoutError, RuntimeError) as exc:
        print(f"not ready: {exc}")
        shutdown()
    print(f"\nFibermill is ready after {time.time() - t0:.1f}s")
    print(f"  web page: {base}/")
    print(f"  API:      {base}   (docs: {base}/docs)")
    print(f"  models:   {base}/v1/models")
    print(f"  metrics:  {base}/metrics   worker metrics: {worker_metrics(settings)}")
    for line in exposure(host, settings):
        print(f"  {line}")
    print("Ctrl-C stops everything.\n", flush=True)
    while True:
        time.sleep(1)
        for p in procs:
            if p.poll() is not None:
                shown = p.args[:3] if isinstance(p.args, list) else p.args
                print(f"{shown!r} exited with {p.returncode}; stopping")
                shutdown()


def _write_pid(name: str, pid: int) -> None:
    (RUN_DIR / f"{name}.pid").write_text(str(pid))


if __name__ == "__main__":
    sys.exit(main())
