"""LitServe as the peers benchmark serves it (benchmarks/litserve_peer.py), in its own
processes, stopped with them; Fibermill's side is a bench_stack."""

import importlib.util
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from pathlib import Path

import httpx

from benchmarks.stack import log_tail
from services.devstack.redis_server import free_port
from shared.settings import REPO_ROOT


@dataclass
class Server:
    url: str
    procs: list[subprocess.Popen]  # each leads a process group of its own (processes.frozen)


def litserve_available() -> bool:
    return importlib.util.find_spec("litserve") is not None


@contextmanager
def litserve_server(model_dir: Path, logdir: Path, max_batch: int, batch_timeout: float,
                    threads: int | None = None, timeout: float = 300) -> Iterator[Server]:
    """benchmarks/litserve_peer.py in its own session (LitServe starts several
    processes, `threads` intra-op threads each; `timeout`: a request's, in seconds); yields
    it, and stops the whole process group at the end."""
    port = free_port()
    log = logdir / f"litserve-{port}.log"
    cmd = [sys.executable, "-m", "benchmarks.litserve_peer", "--model-dir", str(model_dir),
           "--port", str(port), "--max-batch-size", str(max_batch),
           "--batch-timeout", str(batch_timeout), "--timeout", str(timeout)]
    with open(log, "wb") as out:
        env = {**os.environ, **({} if threads is None else {"OMP_NUM_THREADS": str(threads)})}
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT,
                                start_new_session=True, cwd=REPO_ROOT, env=env)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.time() + 180
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"LitServe exited with {proc.returncode}:\n{log_tail(log)}")
            try:
                if httpx.get(f"{base}/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.time() > deadline:
                raise TimeoutError(f"LitServe not healthy in 180 s:\n{log_tail(log)}")
            time.sleep(0.2)
        yield Server(base, [proc])
    finally:
        _stop_group(proc)


def _stop_group(proc: subprocess.Popen, timeout: float = 15.0) -> None:
    """SIGTERM the process group `proc` leads, SIGKILL what is left after `timeout`."""
    pgid = proc.pid

    def signal_group(sig: int) -> bool:
        try:
            os.killpg(pgid, sig)
            return True
        except ProcessLookupError:
            return False

    signal_group(signal.SIGTERM)
    deadline = time.time() + timeout
    while time.time() < deadline:
        proc.poll()
        if not signal_group(0):
            break
        time.sleep(0.1)
    else:
        signal_group(signal.SIGKILL)
    with suppress(subprocess.TimeoutExpired):
        proc.wait(timeout=5)
