"""Start one worker process per visible GPU (pinned with CUDA_VISIBLE_DEVICES), or
FIBERMILL_CPU_WORKERS processes where there is none, and keep them running.

Each child is a fresh interpreter (never a fork), so CUDA is initialised only in the process
that uses it. A child that dies is restarted. SIGTERM/SIGINT are passed on to every child as
SIGTERM, and the launcher waits for their drain (docs/architecture.md, "Drain (SIGTERM)"),
killing a child still there `KILL_MARGIN_SECONDS` after its drain should have ended.
"""

import logging
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from services.worker.devices import visible_gpus
from services.worker.drain import DRAIN_STOP_GRACE_SECONDS
from shared.logs import configure as configure_logs
from shared.names import queue_for
from shared.registry import ModelRegistry, load_registry
from shared.settings import Settings, get_settings

log = logging.getLogger("fibermill.launcher")
# Restarts of a child that dies before it is ready (its models loaded) back off, so a worker
# that cannot load does not spin; one that was ready and serving restarts at once (a kill from
# outside, an OOM under load, a poison sub-request: what it held is recovered by the janitor,
# and a slot left empty only slows the rest down).
RESTART_BACKOFF_SECONDS = (1, 2, 5, 10, 30)
# A child that ran this long was healthy: its next crash starts the backoff over.
HEALTHY_SECONDS = 60.0
# Past the drain and its stop grace: time for a child to withdraw and exit before it is killed.
KILL_MARGIN_SECONDS = 10.0


@dataclass
class Slot:
    index: int
    device: str  # "cuda" or "cpu"
    visible: str  # the CUDA_VISIBLE_DEVICES value for this child
    proc: subprocess.Popen | None = None
    restarts: int = 0  # crashes in a row, each before ready and within HEALTHY_SECONDS
    started_at: float = 0.0  # time.monotonic()
    # Created by the child once its models are loaded (FIBERMILL_READY_FILE).
    ready_file: Path | None = None
    restart_at: float | None = None  # time.monotonic() when its exited child is started again

    @property
    def was_ready(self) -> bool:
        return self.ready_file is not None and self.ready_file.exists()

    def restart_delay(self) -> float:
        """The wait before restarting this slot's child, which just exited."""
        if self.was_ready:
            self.restarts = 0
            return 0.0
        if time.monotonic() - self.started_at >= HEALTHY_SECONDS:
            self.restarts = 0
        delay = RESTART_BACKOFF_SECONDS[min(self.restarts, len(RESTART_BACKOFF_SECONDS) - 1)]
        self.restarts += 1
        return delay


def plan(settings: Settings) -> list[Slot]:
    gpus = visible_gpus()
    if gpus:
        return [Slot(i, "cuda", g) for i, g in enumerate(gpus)]
    return [Slot(i, "cpu", "") for i in range(settings.cpu_workers)]


def default_concurrency(registry: ModelRegistry, models: list[str]) -> int:
    """Sub-requests a worker holds: a batch on the device and the next one filling up."""
    return 2 * max(registry.get(m).max_batch for m in models)


def command(settings: Settings, slot: Slot, name: str) -> list[str]:
    registry = load_registry(settings.model_registry)
    models = settings.served_models or list(registry.models)
    return [
        sys.executable,
        "-m",
        "celery",
        # No banner: the worker logs what it loaded and serves, one line each.
        *([] if settings.log_level == "DEBUG" else ["--quiet"]),
        "-A",
        "services.worker.celery_app",
        "worker",
        "-P",
        "threads",
        "-c",
        str(settings.worker_concurrency or default_concurrency(registry, models)),
        "-Q",
        ",".join(queue_for(m) for m in models),
        "-n",
        f"{name}@%h",
        "--loglevel",
        settings.log_level,
        "--without-gossip",
        "--without-mingle",
        "--without-heartbeat",
    ]


def environment(settings: Settings, slot: Slot, name: str, n_slots: int) -> dict[str, str]:
    env = dict(os.environ)
    env.update(
        CUDA_VISIBLE_DEVICES=slot.visible if slot.device == "cuda" else "",
        FIBERMILL_DEVICE=slot.device,
        FIBERMILL_DEVICE_INDEX=str(slot.index),
        FIBERMILL_WORKER_NAME=name,
    )
    if slot.device == "cpu":
        if settings.cpu_threads is not None:
            env["OMP_NUM_THREADS"] = str(settings.cpu_threads)
        else:
            # CPU workers share the host's cores instead of each claiming all of them.
            threads = max(1, (os.cpu_count() or 1) // max(1, n_slots))
            env.setdefault("OMP_NUM_THREADS", str(threads))
    return env


def start(settings: Settings, slot: Slot, n_slots: int) -> None:
    name = f"{socket.gethostname()}-{slot.device}{slot.index}"
    env = environment(settings, slot, name, n_slots)
    if slot.ready_file is not None:
        slot.ready_file.unlink(missing_ok=True)
        env["FIBERMILL_READY_FILE"] = str(slot.ready_file)
    slot.proc = subprocess.Popen(command(settings, slot, name), env=env)
    slot.started_at = time.monotonic()
    log.info("started worker %s (pid %d)", name, slot.proc.pid)


def main() -> int:
    configure_logs("launcher")
    settings = get_settings()
    slots = plan(settings)
    if not slots:
        log.error("no GPU found and FIBERMILL_CPU_WORKERS=0: nothing to start")
        return 1
    stopping = False

    def stop(signum, _frame):
        nonlocal stopping
        stopping = True
        for s in slots:
            if s.proc and s.proc.poll() is None:
                s.proc.send_signal(signal.SIGTERM)

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    ready_dir = Path(tempfile.mkdtemp(prefix="fibermill-launcher-"))
    for s in slots:
        s.ready_file = ready_dir / f"slot-{s.index}.ready"
        start(settings, s, len(slots))
    while not stopping:
        time.sleep(0.2)
        supervise(settings, slots)
    shutil.rmtree(ready_dir, ignore_errors=True)
    # Again, for a child started while the signal arrived (Celery ignores a second SIGTERM).
    stop(signal.SIGTERM, None)
    wait_children(slots, settings.drain_seconds + DRAIN_STOP_GRACE_SECONDS + KILL_MARGIN_SECONDS)
    return 0


def supervise(settings: Settings, slots: list[Slot]) -> None:
    """Schedule the restart of each child that exited, and start those that are due; a slot
    waiting out its backoff never holds up another's restart."""
    now = time.monotonic()
    for s in slots:
        proc = s.proc
        assert proc is not None, "every slot was started before any is supervised"
        if s.restart_at is None and proc.poll() is not None:
            delay = s.restart_delay()
            s.restart_at = now + delay
            log.warning("worker slot %d exited with %s%s; restarting in %ss", s.index,
                        proc.returncode, "" if s.was_ready else " before it was ready", delay)
        if s.restart_at is not None and now >= s.restart_at:
            s.restart_at = None
            start(settings, s, len(slots))


def wait_children(slots: list[Slot], timeout: float) -> None:
    """Wait for every child to exit; SIGKILL the ones still running after `timeout` seconds
    (their leases expire and the janitor re-sends what they held)."""
    deadline = time.monotonic() + timeout
    for s in slots:
        if s.proc is None:
            continue
        try:
            s.proc.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            log.error("worker slot %d (pid %d) still running %.0fs after SIGTERM; killing it",
                      s.index, s.proc.pid, timeout)
            s.proc.kill()
            s.proc.wait()


if __name__ == "__main__":
    sys.exit(main())
