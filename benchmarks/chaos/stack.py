"""The processes of a chaos run: Redis, two API replicas and the worker launcher, each of which
a fault kills and brings back on its own port, data dir and log file.

processes.py starts a process and forgets how; a fault needs the recipe again (the same API on
the same port, Redis on the same AOF), so this keeps it per process. Redis is started here
rather than with redis_server.start_redis, which discards Redis's log: a run that loses jobs
across a Redis restart needs that log (AOF loading, refused writes) to say why.
"""

import os
import signal
import subprocess
import time
from pathlib import Path
from typing import IO

import httpx
import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from services.devstack.processes import start_api, start_workers, stop, wait_ready
from services.devstack.redis_server import TUNING, find_redis_server, free_port
from shared import names

READY_TIMEOUT = 240.0


class Stack:
    def __init__(self, workdir: Path, env: dict[str, str], workers: int = 2) -> None:
        self.workdir = workdir
        self.logdir = workdir / "logs"
        self.logdir.mkdir(parents=True, exist_ok=True)
        self.redis_dir = workdir / "redis"
        self.redis_port = free_port()
        self.api_ports = [free_port(), free_port()]
        self.n_workers = workers
        self.env = {**env, "FIBERMILL_REDIS_URL": f"redis://127.0.0.1:{self.redis_port}/0",
                    "FIBERMILL_CPU_WORKERS": str(workers)}
        self.redis: subprocess.Popen | None = None
        self.apis: list[subprocess.Popen | None] = [None, None]
        self.workers: subprocess.Popen | None = None
        self.redis_paused = False
        self._logs: list[IO] = []

    @property
    def api_urls(self) -> list[str]:
        return [f"http://127.0.0.1:{p}" for p in self.api_ports]

    def _log(self, name: str) -> IO:
        f = open(self.logdir / f"{name}.log", "a")  # noqa: SIM115 - closed in close()
        self._logs.append(f)
        return f

    def start(self) -> None:
        """Everything, then wait until both replicas see every worker."""
        self.start_redis()
        log = self._log("workers")
        self.workers = start_workers(self.env, stdout=log, stderr=log)
        for i in range(len(self.apis)):
            self.start_api(i)
        for url in self.api_urls:
            wait_ready(url, timeout=READY_TIMEOUT, workers=self.n_workers,
                       procs=[p for p in (self.redis, self.workers, *self.apis) if p])

    def start_redis(self) -> int:
        """Redis with AOF on this run's port and data dir: a restart loads what it wrote; its
        pid."""
        self.redis_dir.mkdir(parents=True, exist_ok=True)
        cmd = [find_redis_server(), "--port", str(self.redis_port), "--bind", "127.0.0.1",
               "--dir", str(self.redis_dir), "--save", "", "--appendonly", "yes",
               "--appendfsync", "everysec", "--maxmemory-policy", "noeviction", *TUNING,
               "--logfile", str((self.logdir / "redis.log").resolve())]
        proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
        self.redis = proc
        client = redis.Redis(port=self.redis_port)
        try:
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline:
                if proc.poll() is not None:
                    raise RuntimeError(f"redis-server exited with {proc.returncode}")
                try:
                    client.ping()  # LOADING (the AOF) is a ConnectionError too
                    return proc.pid
                except redis.ConnectionError:
                    time.sleep(0.05)
            raise RuntimeError(f"redis-server did not answer on port {self.redis_port} in 30s")
        finally:
            client.close()

    def kill_redis(self) -> int:
        return _kill(_started(self.redis, "redis-server"))

    def pause_redis(self) -> int:
        proc = _started(self.redis, "redis-server")
        proc.send_signal(signal.SIGSTOP)
        self.redis_paused = True
        return proc.pid

    def resume_redis(self) -> int:
        proc = _started(self.redis, "redis-server")
        proc.send_signal(signal.SIGCONT)
        self.redis_paused = False
        return proc.pid

    def start_api(self, i: int) -> int:
        log = self._log(f"api{i}")
        proc = start_api(self.api_ports[i], self.env, stdout=log, stderr=log)
        self.apis[i] = proc
        return proc.pid

    def kill_api(self, i: int) -> int:
        return _kill(_started(self.apis[i], f"API replica {i}"))

    def api_answers_after(self, i: int, since: float, timeout: float = 120.0) -> float | None:
        """Seconds from `since` (time.monotonic()) until replica i answers /healthz."""
        deadline = since + timeout
        while time.monotonic() < deadline:
            try:
                if httpx.get(f"{self.api_urls[i]}/healthz", timeout=1).status_code == 200:
                    return time.monotonic() - since
            except httpx.TransportError:
                pass
            time.sleep(0.1)
        return None

    def kill_worker(self) -> str:
        """SIGKILL the longest-running worker that serves (its heartbeat is in Redis), the
        likeliest to hold work; the launcher restarts it. One still loading its models holds
        no work, and killing it would only keep a small machine's fleet at zero, so it is
        spared; with Redis unreachable, which worker serves is unknown and the oldest goes."""
        children = sorted(_children(_started(self.workers, "the worker launcher").pid))
        serving = self._serving_pids()
        if serving is not None:
            children = [c for c in children if c[1] in serving]
        if not children:
            return "skipped: no worker process is serving"
        pid = children[0][1]
        os.kill(pid, signal.SIGKILL)
        return f"pid {pid}" + ("" if serving is not None else " (Redis unreachable: oldest)")

    def primary_port(self) -> int | None:
        """The port of the Redis that takes writes now (a Sentinel stack's moves)."""
        return self.redis_port

    def _serving_pids(self) -> set[int] | None:
        port = self.primary_port()
        if port is None:
            return None
        # One try, one second: redis-py's default retries would hold a fault schedule for
        # ~15 s against a frozen Redis.
        client = redis.Redis(port=port, socket_timeout=1, socket_connect_timeout=1,
                             retry=Retry(NoBackoff(), 0))
        try:
            keys = client.keys(f"{names.WORKER_PREFIX}*")
        except redis.RedisError:
            return None
        finally:
            client.close()
        return {int((k.decode() if isinstance(k, bytes) else k).rsplit("/", 1)[1]) for k in keys}

    def stored_job_ids(self) -> set[str]:
        port = self.primary_port()
        if port is None:
            raise RuntimeError("no Redis primary to read the stored jobs from")
        client = redis.Redis(port=port, decode_responses=True)
        try:
            return {k.split(":")[2] for k in client.scan_iter(names.job_key("*"), count=1000)
                    if k.count(":") == 2}
        finally:
            client.close()

    def log_files(self) -> list[Path]:
        return sorted(self.logdir.glob("*.log"))

    def tails(self, chars: int = 3000) -> str:
        out = []
        for path in self.log_files():
            text = path.read_text(errors="replace")
            out.append(f"==> {path} (last {min(chars, len(text))} chars) <==\n{text[-chars:]}")
        return "\n".join(out)

    def close(self) -> None:
        if self.redis_paused and self.redis and self.redis.poll() is None:
            self.resume_redis()  # a stopped Redis would hold the others' shutdown
        stop([p for p in (*self.apis, self.workers, self.redis) if p is not None], timeout=30)
        for f in self._logs:
            f.close()


def _started(proc: subprocess.Popen | None, what: str) -> subprocess.Popen:
    if proc is None:
        raise RuntimeError(f"{what} is not started")
    return proc


def _kill(proc: subprocess.Popen) -> int:
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    return proc.pid


def _children(ppid: int) -> list[tuple[float, int]]:
    try:
        import psutil
    except ImportError:
        return _children_from_proc(ppid)
    try:
        kids = psutil.Process(ppid).children()
    except psutil.NoSuchProcess:
        return []
    found = []
    for k in kids:
        try:
            if k.status() != psutil.STATUS_ZOMBIE:
                found.append((k.create_time(), k.pid))
        except psutil.NoSuchProcess:
            continue
    return found


def _children_from_proc(ppid: int) -> list[tuple[float, int]]:
    """Without psutil: /proc/<pid>/stat gives each process's state, parent and start tick."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2:].split()  # after "pid (comm) "
        state, parent, start_ticks = fields[0], int(fields[1]), float(fields[19])
        if parent == ppid and state != "Z":
            found.append((start_ticks, int(entry.name)))
    return found
