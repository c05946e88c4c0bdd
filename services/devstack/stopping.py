"""How `make run` stops: at the first Ctrl-C it says what it waits for (the jobs the workers
still run, by worker, and the longest it can take) and stops its children in order; a second
Ctrl-C stops at once.

A stop at once kills the workers' process group. What they ran is not lost: its lease expires
and the janitor of the next `make run` sends it again (a sub-request a worker held but had not
leased is sent again by the orphan sweep), as for any worker lost from outside
(docs/architecture.md, "Drain (SIGTERM)"). Redis, last, is always stopped with SIGTERM, so its
append-only file keeps every job.
"""

import os
import signal
import socket
import subprocess
import time
from collections import defaultdict
from contextlib import suppress
from dataclasses import dataclass

import redis

from services.worker.drain import DRAIN_STOP_GRACE_SECONDS
from shared import names
from shared.messages import WorkerHeartbeat
from shared.redis_client import connect_sync, primary_address
from shared.settings import Settings

# Past the worker's own drain and stop grace, how long the launcher gives a worker before it
# kills it (services/worker/launcher.py KILL_MARGIN_SECONDS), plus a little for the launcher.
WORKERS_MARGIN_SECONDS = 15.0


def drain_wait_seconds(settings: Settings) -> float:
    """The longest a worker takes to finish or hand back what it holds after SIGTERM."""
    return settings.drain_seconds + DRAIN_STOP_GRACE_SECONDS


def running_jobs(settings: Settings) -> dict[str, set[str]] | None:
    """The jobs a live lease holds, by the worker slot that runs them ("cpu0"); None when
    Redis does not answer at once (the message then does without the count)."""
    try:
        with connect_sync(settings, socket_timeout=1, socket_connect_timeout=1,
                          decode_responses=True) as client:
            now, micros = client.time()
            members = client.zrangebyscore(names.LEASES, f"({now + micros / 1e6}", "+inf")
            owners = []
            for member in members:
                job_id, index = names.split_member(member)
                owners.append((job_id, client.hget(names.job_key(job_id),
                                                   names.owner_field(index))))
    except (redis.RedisError, OSError):
        return None
    held: dict[str, set[str]] = defaultdict(set)
    host = socket.gethostname() + "-"
    for job_id, owner in owners:
        if not owner or owner.startswith("janitor:") or "#" in owner:  # not a worker's
            continue
        name = owner.split("/", 1)[0]  # a worker id is "<slot name>/<pid>"
        held[name.removeprefix(host)].add(job_id)
    return dict(held)


def current_primary(settings: Settings) -> tuple[str, int] | None:
    """The address the sentinels give for the primary now; None when none answers."""
    try:
        return primary_address(settings)
    except (redis.RedisError, OSError):
        return None


def forget_lost_workers(redis_url: str) -> int:
    """Delete the heartbeats of this machine's workers that are gone (a stop at once killed
    them, so none withdrew): until they expire the API would count them as live and report
    ready before the new workers are. Returns how many."""
    host = socket.gethostname()
    gone = 0
    with redis.Redis.from_url(redis_url, socket_timeout=5) as client:
        for key in client.scan_iter(match=f"{names.WORKER_PREFIX}*", count=500):
            raw = client.get(key)
            if not raw:
                continue
            info = WorkerHeartbeat.decode(raw)
            if info.host == host and not _running(info.pid):
                gone += client.delete(key)
    return gone


def _running(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _jobs(n: int) -> str:
    return f"{n} running job{'' if n == 1 else 's'}"


def stop_message(held: dict[str, set[str]] | None, wait_seconds: float) -> str:
    """The line the first Ctrl-C prints."""
    again = "press Ctrl-C again to stop now"
    if held is None:
        return (f"stopping: waiting up to {wait_seconds:.0f} s for the workers to finish or "
                f"hand back what they run; {again}")
    if not held:
        return f"stopping: no job is running; {again}"
    parts = [f"{_jobs(len(jobs))} on worker {name}" for name, jobs in sorted(held.items())]
    return (f"stopping: waiting up to {wait_seconds:.0f} s for {', '.join(parts)} to finish "
            f"or be handed back; {again} (what runs then goes back to the queue and finishes "
            "at the next `make run`)")


@dataclass
class Child:
    proc: subprocess.Popen
    timeout: float  # after SIGTERM, before SIGKILL
    soft: bool = False  # stopped with SIGTERM even by a stop at once (Redis: its AOF)
    group: bool = False  # leads a process group of its own (start_new_session=True)

    def __post_init__(self) -> None:
        with suppress(ProcessLookupError):
            self.group = os.getpgid(self.proc.pid) == self.proc.pid


class Stopper:
    """Stops children in order (SIGTERM, waiting for each), and at once when `now()` is
    called: from then on every child not `soft` has its whole process group killed."""

    def __init__(self, children: list[Child]) -> None:
        self.children = children  # the caller's list: it adds each child as it starts it
        self.hard = False

    def now(self) -> None:
        """A second Ctrl-C. Called from a signal handler: only sets a flag."""
        self.hard = True

    def stop(self) -> None:
        for child in self.children:
            self._stop(child)

    def _stop(self, child: Child) -> None:
        proc = child.proc
        if proc.poll() is None and not (self.hard and not child.soft):
            proc.terminate()
        deadline = time.monotonic() + child.timeout
        while proc.poll() is None:
            if (self.hard and not child.soft) or time.monotonic() >= deadline:
                _kill(child)
            with suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=0.1)
        if child.group and not child.soft:
            _kill(child)  # what the group's leader left behind (a worker the launcher started)


def _kill(child: Child) -> None:
    """SIGKILL the child's process group, or the child alone when it leads none."""
    if child.group:
        with suppress(ProcessLookupError, PermissionError):
            os.killpg(child.proc.pid, signal.SIGKILL)
    else:
        child.proc.kill()
