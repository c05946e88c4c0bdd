"""Start the API and the worker launcher as child processes, and wait until they serve."""

import json
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager, suppress


def start_api(port: int, env: Mapping[str, str], host: str = "127.0.0.1",
              **popen) -> subprocess.Popen:
    """The API through services.api.serve (uvicorn with a drain at SIGTERM). A local stack
    has no load balancer to drain, so FIBERMILL_API_DRAIN_SECONDS defaults to 0 here."""
    cmd = [sys.executable, "-m", "services.api.serve", "--host", host,
           "--port", str(port), "--log-level", "warning", "--timeout-graceful-shutdown", "10"]
    return subprocess.Popen(cmd, env={"FIBERMILL_API_DRAIN_SECONDS": "0", **os.environ, **env},
                            **popen)


def start_workers(env: Mapping[str, str], **popen) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "services.worker.launcher"],
                            env={**os.environ, **env}, **popen)


def wait_ready(base_url: str, timeout: float = 120.0, workers: int = 1,
               procs: Sequence[subprocess.Popen] = ()) -> dict:
    """Poll /readyz until it reports at least `workers` live workers."""
    deadline = time.time() + timeout
    last = "no answer"
    while time.time() < deadline:
        for p in procs:
            if p.poll() is not None:
                raise RuntimeError(f"{p.args!r} exited with {p.returncode} before ready")
        try:
            with urllib.request.urlopen(f"{base_url}/readyz", timeout=2) as r:
                body = json.loads(r.read())
                if body.get("workers", 0) >= workers:
                    return body
                last = str(body)
        except urllib.error.HTTPError as e:
            last = e.read().decode(errors="replace")
        except (urllib.error.URLError, OSError) as e:
            last = str(e)
        time.sleep(0.2)
    raise TimeoutError(f"{base_url} not ready with {workers} worker(s) in {timeout}s: {last}")


def stop(procs: list[subprocess.Popen], timeout: float = 30.0) -> None:
    """Stop one after another, in the order given (SIGTERM, then SIGKILL after `timeout`), so
    that a process still shutting down can reach the ones it depends on (Redis last)."""
    for p in procs:
        if p.poll() is None:
            p.terminate()
        try:
            p.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


@contextmanager
def frozen(procs: Sequence[subprocess.Popen]) -> Iterator[None]:
    """SIGSTOP the process groups that `procs` lead (each started with start_new_session=True)
    for the block, SIGCONT after it. A benchmark freezes the servers that are not taking their
    turn: an idle server's polling loops wake up often enough to stall another's OpenMP team
    (an idle LitServe took about 110 ms of CPU a second here, and `generate` ran a third slower
    beside it)."""
    groups = []
    for p in procs:
        if p.poll() is not None:
            continue
        if os.getpgid(p.pid) != p.pid:
            raise ValueError(f"{p.args!r} does not lead a process group of its own")
        groups.append(p.pid)
    for g in groups:
        os.killpg(g, signal.SIGSTOP)
    try:
        yield
    finally:
        for g in groups:
            with suppress(ProcessLookupError):
                os.killpg(g, signal.SIGCONT)
