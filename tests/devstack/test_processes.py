"""Benchmark process helpers: freezing a server while another takes its turn."""

import subprocess
import sys
import time
from pathlib import Path

import pytest

from services.devstack.processes import frozen

SPIN = "while True: pass"


def _cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / 100  # utime + stime, in clock ticks


def _spinning(**popen) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", SPIN], **popen)


def test_a_frozen_process_takes_no_cpu_and_runs_again_after():
    proc = _spinning(start_new_session=True)
    try:
        time.sleep(0.3)
        with frozen([proc]):
            time.sleep(0.1)  # the stop has landed
            before = _cpu_seconds(proc.pid)
            time.sleep(0.5)
            assert _cpu_seconds(proc.pid) == before
        time.sleep(0.5)
        assert _cpu_seconds(proc.pid) > before
    finally:
        proc.kill()
        proc.wait()


def test_only_a_process_leading_its_own_group_is_frozen():
    # Stopping the group of a process started in ours would stop the benchmark itself.
    proc = _spinning()
    try:
        with pytest.raises(ValueError, match="process group"), frozen([proc]):
            pass
    finally:
        proc.kill()
        proc.wait()
