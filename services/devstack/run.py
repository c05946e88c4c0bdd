"""`make run`: Redis (unless FIBERMILL_REDIS_URL or FIBERMILL_REDIS_SENTINELS names one), the
API and the workers.

Listens on 127.0.0.1 unless FIBERMILL_API_HOST says otherwise, and prints who can reach it.
State (Redis data, pid files, a lock) lives in run/ (FIBERMILL_RUN_DIR): a second `make run`
on the same state is refused with the first one's address instead of taking it over. A
previous run's leftover processes (its runner gone) are stopped first. Ctrl-C stops everything
this started, saying what it waits for; a second Ctrl-C stops at once (stopping.py).
"""

import fcntl
import ipaddress
import os
import shutil
import signal
import socket
import sys
import time
from pathlib import Path
from typing import IO
from urllib.parse import urlsplit, urlunsplit

from services.cli.args import DEFAULT_URL
from services.devstack.processes import start_api, start_workers, wait_ready
from services.devstack.redis_server import free_port, start_redis
from services.devstack.stopping import (
    WORKERS_MARGIN_SECONDS,
    Child,
    Stopper,
    current_primary,
    drain_wait_seconds,
    forget_lost_workers,
    running_jobs,
    stop_message,
)
from services.worker.launcher import plan
from services.worker.metrics_server import reported_ports
from shared import names
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


def url_host(host: str) -> str:
    """The host part of a URL that reaches an API listening on `host`."""
    if host in ("0.0.0.0", "::"):
        return "127.0.0.1"
    return f"[{host}]" if ":" in host else host


# How long the banner waits for the workers to say which port their /metrics took: each binds
# it once its models are loaded, a moment after it first reports ready.
METRICS_REPORT_SECONDS = 10.0


def worker_metrics(settings: Settings, port_dir: Path, host: str,
                   wait: float = METRICS_REPORT_SECONDS) -> str:
    """The worker /metrics addresses, as the workers report them bound (a taken port is
    replaced by a free one)."""
    if settings.worker_metrics_port <= 0:
        return "off (FIBERMILL_WORKER_METRICS_PORT=0)"
    expected = len(plan(settings))
    deadline = time.monotonic() + wait
    while len(ports := reported_ports(port_dir)) < expected and time.monotonic() < deadline:
        time.sleep(0.2)
    shown = "  ".join(f"http://{url_host(host)}:{p}/metrics" for _, p in sorted(ports.items()))
    if len(ports) < expected:
        late = expected - len(ports)
        shown += (f"{'  ' if shown else ''}({late} worker{'s' if late > 1 else ''} not serving "
                  f"yet: {port_dir} gets the port)")
    return shown


def cli_hint(base: str) -> str | None:
    """What the CLI needs to reach this API when it is not at the CLI's default address."""
    if base == DEFAULT_URL:
        return None
    return f"export FIBERMILL_URL={base}   (for the CLI, which otherwise calls {DEFAULT_URL})"


def webhook_secret_hint(settings: Settings, base: str, redis_cli: str) -> str:
    """Where the secret that signs this stack's webhooks is read (services/api/webhooks)."""
    if settings.api_key_list:
        return (f"webhook secrets: one per API key: curl -s {base}/v1/webhook-secret "
                "-H 'Authorization: Bearer <key>'")
    if settings.webhook_secret:
        return "webhook secret: the one FIBERMILL_WEBHOOK_SECRET sets"
    return (f"webhook secret: curl -s {base}/v1/webhook-secret   (or {redis_cli} GET "
            f"{names.WEBHOOK_SECRET}, once the first webhook or that call made it)")


class _Stop(Exception):
    """The first Ctrl-C (or SIGTERM): leave what main is doing and stop in order."""


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
    base = f"http://{url_host(host)}:{port}"
    lock.truncate(0)
    lock.write(f"runner pid {os.getpid()}, API at {base}\n")
    lock.flush()
    # Private webhook targets (a receiver on this machine) only while nothing else can reach
    # the API; set FIBERMILL_WEBHOOK_ALLOW_PRIVATE to decide otherwise.
    private = os.environ.get("FIBERMILL_WEBHOOK_ALLOW_PRIVATE", str(_loopback(host)).lower())
    metrics_dir = RUN_DIR / "metrics"  # each worker writes the /metrics port it is bound to
    shutil.rmtree(metrics_dir, ignore_errors=True)
    env = {"FIBERMILL_WEBHOOK_ALLOW_PRIVATE": private,
           "FIBERMILL_BLOB_DIR": os.environ.get("FIBERMILL_BLOB_DIR", str(RUN_DIR / "blobs")),
           # The workers' /metrics as reachable as the API, no more.
           "FIBERMILL_WORKER_METRICS_HOST": os.environ.get("FIBERMILL_WORKER_METRICS_HOST", host),
           "FIBERMILL_WORKER_METRICS_PORT_DIR": str(metrics_dir)}
    settings = Settings(webhook_allow_private=private)
    children: list[Child] = []  # in stop order: the API, the workers, then Redis
    stopper = Stopper(children)
    presses = 0  # Ctrl-Cs (and SIGTERMs); from 1 on, main is stopping
    starting = True  # children being started: a first Ctrl-C waits until each is registered

    def on_signal(*_) -> None:
        nonlocal presses
        presses += 1
        if presses > 1:
            stopper.now()  # a signal handler: the stop in progress notices it
        elif not starting:
            raise _Stop

    signal.signal(signal.SIGINT, on_signal)
    signal.signal(signal.SIGTERM, on_signal)
    failed = False
    redis_url = os.environ.get("FIBERMILL_REDIS_URL", "")
    try:
        if settings.sentinel_addresses:
            redis_cli = _sentinel_banner(settings)
        elif redis_url:
            safe_url, secret = _without_password(redis_url)
            redis_cli = f"redis-cli -u {safe_url}" + (" --askpass" if secret else "")
            print(f"Redis:   {safe_url} (from FIBERMILL_REDIS_URL)")
        else:
            redis_port = free_port()
            redis_proc = start_redis(redis_port, RUN_DIR / "redis", start_new_session=True)
            # SIGTERM even when stopping at once: Redis writes its append-only file out.
            children.append(Child(redis_proc, timeout=10, soft=True))
            _write_pid("redis", redis_proc.pid)
            redis_url = env["FIBERMILL_REDIS_URL"] = f"redis://127.0.0.1:{redis_port}/0"
            redis_cli = f"redis-cli -p {redis_port}"
            print(f"Redis:   {redis_url} (started here, data in {RUN_DIR}/redis)")
            forget_lost_workers(redis_url)  # a previous run's, stopped at once
        # Own sessions: a Ctrl-C reaches only this runner, which stops the rest in order.
        workers = start_workers(env, start_new_session=True)
        children.insert(0, Child(
            workers, timeout=drain_wait_seconds(settings) + WORKERS_MARGIN_SECONDS))
        _write_pid("workers", workers.pid)
        api = start_api(port, env, host=host, start_new_session=True)
        children.insert(0, Child(api, timeout=15))  # its graceful shutdown takes 10 s at most
        _write_pid("api", api.pid)
        starting = False
        if presses:
            raise _Stop
        t0 = time.time()
        try:
            wait_ready(base, timeout=600, procs=[api, workers])
        except (TimeoutError, RuntimeError) as exc:
            presses, failed = 1, True
            print(f"not ready: {exc}")
            raise _Stop from exc
        print(f"\nFibermill is ready after {time.time() - t0:.1f}s")
        print(f"  web page: {base}/")
        print(f"  API:      {base}   (docs: {base}/docs)")
        if hint := cli_hint(base):
            print(f"  CLI:      {hint}")
        print(f"  models:   {base}/v1/models")
        print(f"  metrics:  {base}/metrics   worker metrics: "
              f"{worker_metrics(settings, metrics_dir, env['FIBERMILL_WORKER_METRICS_HOST'])}")
        for line in [*exposure(host, settings),
                     webhook_secret_hint(settings, base, redis_cli)]:
            print(f"  {line}")
        print("Ctrl-C stops everything.\n", flush=True)
        while not failed:
            time.sleep(1)
            for child in children:
                p = child.proc
                if p.poll() is not None:
                    shown = p.args[:3] if isinstance(p.args, list) else p.args
                    presses, failed = 1, True
                    print(f"{shown!r} exited with {p.returncode}; stopping")
                    break
    except _Stop:
        pass
    held = (running_jobs(settings.model_copy(update={"redis_url": redis_url}))
            if redis_url or settings.sentinel_addresses else {})
    print("\n" + stop_message(held, drain_wait_seconds(settings)), flush=True)
    stopper.stop()
    for pidfile in RUN_DIR.glob("*.pid"):
        pidfile.unlink(missing_ok=True)
    if stopper.hard:
        print("stopped at once; what the workers ran goes back to the queue and finishes at "
              "the next `make run`", flush=True)
    else:
        print("stopped", flush=True)
    return 1 if failed else 0


def _write_pid(name: str, pid: int) -> None:
    (RUN_DIR / f"{name}.pid").write_text(str(pid))



def _sentinel_banner(settings: Settings) -> str:
    """Print where the Redis is (the sentinels, and the primary they name now); the
    redis-cli command that reaches the primary."""
    shown = ",".join(f"{h}:{p}" for h, p in settings.sentinel_addresses)
    primary = current_primary(settings)
    where = f"{primary[0]}:{primary[1]}" if primary else "not known yet"
    print(f"Redis:   primary {settings.redis_sentinel_master!r} from the sentinels {shown} "
          f"(FIBERMILL_REDIS_SENTINELS), now {where}")
    _, secret = _without_password(settings.redis_url)
    host, port = primary or settings.sentinel_addresses[0]
    return f"redis-cli -h {host} -p {port}" + (" --askpass" if secret else "")


def _without_password(url: str) -> tuple[str, bool]:
    """`url` with its password left out (a banner must not print it), and whether it had
    one."""
    parts = urlsplit(url)
    if parts.password is None:
        return url, False
    user = f"{parts.username}@" if parts.username else ""
    host = parts.hostname or ""
    netloc = f"{user}{host}" + (f":{parts.port}" if parts.port else "")
    return urlunsplit(parts._replace(netloc=netloc)), True


if __name__ == "__main__":
    sys.exit(main())
