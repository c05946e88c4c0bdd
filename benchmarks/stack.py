"""The local stack the benchmarks measure: Redis, the API and one CPU worker (the launcher and
its worker process), each started in a session of its own so a benchmark can freeze it while
something else takes its turn (processes.frozen)."""

import subprocess
import tempfile
from collections.abc import Iterator, Mapping
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path

from benchmarks.procstat import children
from services.devstack.processes import start_api, start_workers, stop, wait_ready
from services.devstack.redis_server import free_port, start_redis


@dataclass
class BenchStack:
    url: str  # the API's
    redis_port: int
    metrics_url: str  # the worker's /metrics
    procs: list[subprocess.Popen]  # the API, the worker launcher, Redis: each leads its group

    @property
    def api(self) -> subprocess.Popen:
        return self.procs[0]

    @property
    def workers(self) -> subprocess.Popen:
        return self.procs[1]

    @property
    def redis(self) -> subprocess.Popen:
        return self.procs[2]

    def serving_pids(self) -> dict[str, list[int]]:
        """The processes that serve its jobs, by role: the API, the worker (the launcher's
        children, not the launcher), Redis."""
        return {"api": [self.api.pid], "worker": children(self.workers.pid),
                "redis": [self.redis.pid]}


def stack_env(redis_port: int, metrics_port: int, models: str, batching: bool) -> dict[str, str]:
    """The environment of a benchmark stack's API and worker; `models` empty: every model in
    the registry."""
    return {"FIBERMILL_REDIS_URL": f"redis://127.0.0.1:{redis_port}/0",
            "FIBERMILL_WORKER_METRICS_PORT": str(metrics_port), "FIBERMILL_LOG_LEVEL": "WARNING",
            "FIBERMILL_WORKER_MODELS": models,
            "FIBERMILL_BATCHING": "true" if batching else "false",
            # the benchmarks submit bursts far past a client's default rate limit
            "FIBERMILL_RATE_LIMIT_PER_MINUTE": "1000000",
            "FIBERMILL_RATE_LIMIT_BURST": "100000"}


def log_tail(path: Path, chars: int = 3000) -> str:
    try:
        return path.read_text(errors="replace")[-chars:]
    except OSError:
        return ""


@contextmanager
def bench_stack(models: str = "", batching: bool = True, threads: int | None = None,
                env: Mapping[str, str] | None = None, logdir: Path | None = None
                ) -> Iterator[BenchStack]:
    """Redis, the API and one CPU worker serving `models` with `threads` intra-op threads (None:
    every core); `env` is added to theirs. With `logdir`, the API's and the worker's output go
    there (and their tails into the error when the stack does not come up), else nowhere."""
    with ExitStack() as files:
        workdir = Path(logdir or files.enter_context(tempfile.TemporaryDirectory()))
        rport, port, mport = free_port(), free_port(), free_port()
        redis_proc = start_redis(rport, workdir / f"redis-{rport}", appendonly=False,
                                 start_new_session=True)
        full_env = {**stack_env(rport, mport, models, batching),
                    **({} if threads is None else {"FIBERMILL_CPU_THREADS": str(threads)}),
                    **(env or {})}
        logs = {role: workdir / f"{role}-{port}.log" for role in ("workers", "api")}
        out = {role: files.enter_context(open(path, "wb")) if logdir else subprocess.DEVNULL
               for role, path in logs.items()}
        workers = start_workers(full_env, stdout=out["workers"], stderr=subprocess.STDOUT,
                                start_new_session=True)
        api = start_api(port, full_env, stdout=out["api"], stderr=subprocess.STDOUT,
                        start_new_session=True)
        procs = [api, workers, redis_proc]
        try:
            base = f"http://127.0.0.1:{port}"
            try:
                wait_ready(base, timeout=300, procs=[api, workers])
            except (TimeoutError, RuntimeError) as exc:
                tails = "".join(f"\n{role}:\n{log_tail(path)}" for role, path in logs.items())
                raise RuntimeError(f"{exc}{tails if logdir else ''}") from exc
            yield BenchStack(base, rport, f"http://127.0.0.1:{mport}/metrics", procs)
        finally:
            stop(procs)
