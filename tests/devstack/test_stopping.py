"""How `make run` stops (services/devstack/stopping.py): what the first Ctrl-C says, and a
second one that kills at once what would otherwise be waited for, all of it."""

import os
import signal
import socket
import subprocess
import sys
import threading
import time

import redis

from services.devstack.stopping import Child, Stopper, forget_lost_workers, stop_message
from shared import names
from shared.messages import WorkerHeartbeat

# Ignores SIGTERM, as a draining worker seems to while it finishes its jobs, and starts a
# grandchild (as the launcher starts its workers) that ignores it too.
STUBBORN = """
import signal, subprocess, sys, time
signal.signal(signal.SIGTERM, signal.SIG_IGN)
child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
print(child.pid, flush=True)
time.sleep(600)
"""


def _stubborn() -> tuple[subprocess.Popen, int]:
    proc = subprocess.Popen([sys.executable, "-c", STUBBORN], stdout=subprocess.PIPE,
                            text=True, start_new_session=True)
    assert proc.stdout is not None
    return proc, int(proc.stdout.readline())


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie (exited, its parent gone or not yet waiting) is not running.
    with open(f"/proc/{pid}/stat") as f:
        return f.read().rsplit(")", 1)[1].split()[0] != "Z"


def test_the_first_ctrl_c_says_what_it_waits_for_by_worker():
    assert stop_message({"cpu0": {"j1"}}, 25.0).startswith(
        "stopping: waiting up to 25 s for 1 running job on worker cpu0 to finish or be "
        "handed back; press Ctrl-C again to stop now")
    assert stop_message({"cpu1": {"a", "b"}, "cpu0": {"c"}}, 25.0).startswith(
        "stopping: waiting up to 25 s for 1 running job on worker cpu0, 2 running jobs on "
        "worker cpu1 to finish")
    assert stop_message({}, 25.0) == "stopping: no job is running; press Ctrl-C again to stop now"
    assert "up to 25 s for the workers" in stop_message(None, 25.0)  # Redis did not answer


def test_a_second_ctrl_c_kills_at_once_what_was_waited_for_and_its_children():
    proc, grandchild = _stubborn()
    soft = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"],
                            start_new_session=True)
    stopper = Stopper([Child(proc, timeout=60), Child(soft, timeout=10, soft=True)])
    stopping = threading.Thread(target=stopper.stop)
    try:
        stopping.start()
        time.sleep(1)
        assert stopping.is_alive() and proc.poll() is None  # waiting for the SIGTERM
        t0 = time.monotonic()
        stopper.now()
        stopping.join(timeout=5)
        assert not stopping.is_alive()
        assert time.monotonic() - t0 < 2
        assert proc.returncode == -signal.SIGKILL
        deadline = time.monotonic() + 2
        while _alive(grandchild) and time.monotonic() < deadline:
            time.sleep(0.05)  # reparented: init reaps it
        assert not _alive(grandchild)
        assert soft.returncode == -signal.SIGTERM  # Redis is always let write its file out
    finally:
        for p in (proc, soft):
            if p.poll() is None:
                p.kill()
                p.wait()
        if proc.stdout:
            proc.stdout.close()


def test_one_that_outlives_its_timeout_is_killed_with_its_group():
    proc, grandchild = _stubborn()
    try:
        t0 = time.monotonic()
        Stopper([Child(proc, timeout=0.5)]).stop()
        assert 0.5 <= time.monotonic() - t0 < 3
        assert proc.returncode == -signal.SIGKILL
        deadline = time.monotonic() + 2
        while _alive(grandchild) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not _alive(grandchild)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        if proc.stdout:
            proc.stdout.close()


def test_a_child_that_stops_at_sigterm_is_waited_for():
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"],
                            start_new_session=True)
    Stopper([Child(proc, timeout=10)]).stop()
    assert proc.returncode == -signal.SIGTERM


def _heartbeat(client: redis.Redis, name: str, host: str, pid: int) -> str:
    info = WorkerHeartbeat(id=f"{name}/{pid}", name=name, host=host, pid=pid, device="cpu",
                           models=["digits"], started_at=time.time(), seen_at=time.time())
    key = names.worker_key(info.id)
    client.set(key, info.encode(), px=15_000)
    return key


def test_the_heartbeats_of_workers_killed_at_once_are_forgotten_at_the_next_start(redis_url):
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    here = socket.gethostname()
    with redis.Redis.from_url(redis_url) as client:
        killed = _heartbeat(client, f"{here}-cpu0", here, dead.pid)
        live = _heartbeat(client, f"{here}-cpu1", here, os.getpid())
        elsewhere = _heartbeat(client, "other-cpu0", "other", dead.pid)

        assert forget_lost_workers(redis_url) == 1

        assert not client.exists(killed)  # the API would count it live for up to 15 s
        assert client.exists(live) and client.exists(elsewhere)
