"""The launcher at SIGTERM: every child gets it, the launcher waits for them to drain, and a
child still running past its drain (plus grace) is killed, so the launcher always exits."""

import os
import signal
import subprocess
import sys
import threading
import time

import pytest

from services.worker import launcher
from shared.settings import get_settings

DRAINS = "import signal, sys, time\n" \
         "signal.signal(signal.SIGTERM, lambda *a: (time.sleep(0.3), sys.exit(0)))\n" \
         "time.sleep(60)"
STUCK = "import signal, time\nsignal.signal(signal.SIGTERM, signal.SIG_IGN)\ntime.sleep(60)"


@pytest.fixture
def settings(monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")  # CPU slots
    monkeypatch.setenv("FIBERMILL_CPU_WORKERS", "2")
    monkeypatch.setenv("FIBERMILL_DRAIN_SECONDS", "1")
    monkeypatch.setattr(launcher, "DRAIN_STOP_GRACE_SECONDS", 0.5)
    monkeypatch.setattr(launcher, "KILL_MARGIN_SECONDS", 0.5)
    get_settings.cache_clear()
    yield
    get_settings.cache_clear()


def _run_main(monkeypatch, programs: list[str]) -> tuple[int, list[subprocess.Popen], float]:
    started: list[subprocess.Popen] = []

    def fake_start(_settings, slot, _n):
        slot.proc = subprocess.Popen([sys.executable, "-c", programs[slot.index]])
        started.append(slot.proc)

    monkeypatch.setattr(launcher, "start", fake_start)
    handlers = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT)}
    # As Kubernetes would SIGTERM the pod's PID 1, once the children run.
    timer = threading.Timer(1.0, os.kill, (os.getpid(), signal.SIGTERM))
    timer.start()
    try:
        rc = launcher.main()
        return rc, started, time.monotonic()
    finally:
        timer.cancel()
        for s, h in handlers.items():
            signal.signal(s, h)
        for p in started:
            if p.poll() is None:
                p.kill()
                p.wait()


def test_sigterm_is_passed_on_and_waited_for(settings, monkeypatch):
    t0 = time.monotonic()
    rc, children, t_end = _run_main(monkeypatch, [DRAINS, DRAINS])
    assert rc == 0
    assert [p.returncode for p in children] == [0, 0]  # each drained and exited by itself
    assert len(children) == 2  # and none was restarted meanwhile
    took = t_end - t0
    assert took > 1.0, "the launcher waited for its children's drain"
    assert took < 5, "and did not wait for the kill margin"


def test_a_child_that_will_not_exit_is_killed_after_its_drain(settings, monkeypatch):
    t0 = time.monotonic()
    rc, children, t_end = _run_main(monkeypatch, [DRAINS, STUCK])
    assert rc == 0
    assert [p.returncode for p in children] == [0, -signal.SIGKILL]
    # SIGTERM at 1 s, then drain (1) + stop grace (0.5) + margin (0.5) before the kill.
    assert 2.8 < t_end - t0 < 8


def test_restart_backoff_grows_and_resets_after_a_healthy_run(monkeypatch):
    clock = {"now": 1000.0}
    monkeypatch.setattr(launcher.time, "monotonic", lambda: clock["now"])
    slot = launcher.Slot(0, "cpu", "")
    delays = []
    for _ in range(7):  # crashes right after each start, before it was ever ready
        slot.started_at = clock["now"]
        clock["now"] += 1
        delays.append(slot.restart_delay())
    assert delays == [1, 2, 5, 10, 30, 30, 30]
    slot.started_at = clock["now"]
    clock["now"] += launcher.HEALTHY_SECONDS  # then a healthy minute before the next crash
    assert slot.restart_delay() == 1


def test_a_child_that_was_ready_restarts_at_once(monkeypatch, tmp_path):
    """Killed from outside while serving, again and again: no backoff, since it loaded its
    models each time (the ready file it creates then)."""
    clock = {"now": 1000.0}
    monkeypatch.setattr(launcher.time, "monotonic", lambda: clock["now"])
    slot = launcher.Slot(0, "cpu", "", ready_file=tmp_path / "slot-0.ready")
    for _ in range(6):
        slot.started_at = clock["now"]
        slot.ready_file.touch()
        clock["now"] += 5
        assert slot.restart_delay() == 0
    slot.ready_file.unlink()  # one that dies before it is ready backs off from the start
    assert [slot.restart_delay() for _ in range(2)] == [1, 2]


def test_one_slot_waiting_out_its_backoff_does_not_hold_up_another(settings, monkeypatch):
    started: list[int] = []

    class Exited:
        returncode = 1

        def poll(self):
            return 1

    def fake_start(_settings, slot, _n):
        started.append(slot.index)
        slot.proc = Exited()

    monkeypatch.setattr(launcher, "start", fake_start)
    slots = [launcher.Slot(0, "cpu", "", proc=Exited()), launcher.Slot(1, "cpu", "",
                                                                        proc=Exited())]
    slots[0].restarts = 4  # deep in its backoff: 30 s
    launcher.supervise(get_settings(), slots)
    assert started == [] and slots[1].restart_at is not None
    slots[1].restart_at = 0.0  # slot 1's second is up; slot 0 still waits
    launcher.supervise(get_settings(), slots)
    assert started == [1]


def test_cpu_workers_divide_the_cores_unless_told_their_threads(settings, monkeypatch):
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.setattr(launcher.os, "cpu_count", lambda: 8)
    cpu = launcher.Slot(0, "cpu", "")
    env = launcher.environment(get_settings(), cpu, "w-cpu0", 2)
    assert env["OMP_NUM_THREADS"] == "4" and env["FIBERMILL_DEVICE"] == "cpu"
    monkeypatch.setenv("OMP_NUM_THREADS", "3")  # an operator's own setting is kept
    assert launcher.environment(get_settings(), cpu, "w-cpu0", 2)["OMP_NUM_THREADS"] == "3"
    monkeypatch.setenv("FIBERMILL_CPU_THREADS", "1")  # and the worker setting wins over it
    get_settings.cache_clear()
    assert launcher.environment(get_settings(), cpu, "w-cpu0", 2)["OMP_NUM_THREADS"] == "1"
