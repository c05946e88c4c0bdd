"""CPU time of processes and threads, from /proc, and what a worker's threads are, by their
Python names (`py-spy dump`)."""

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

TICKS = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int) -> float:
    """utime + stime of a process (all its threads), in seconds; 0 once it is gone."""
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return 0.0
    fields = raw.rsplit(")", 1)[1].split()  # fields[0] is field 3 (state)
    return (int(fields[11]) + int(fields[12])) / TICKS


def thread_cpu_seconds(pid: int) -> dict[int, float]:
    """utime + stime of each thread of a process, by thread id."""
    out: dict[int, float] = {}
    try:
        tids = [int(t) for t in os.listdir(f"/proc/{pid}/task")]
    except OSError:
        return out
    for tid in tids:
        try:
            raw = Path(f"/proc/{pid}/task/{tid}/stat").read_text()
        except OSError:
            continue
        fields = raw.rsplit(")", 1)[1].split()
        out[tid] = (int(fields[11]) + int(fields[12])) / TICKS
    return out


def python_thread_names(pid: int) -> dict[int, str]:
    """Thread id -> Python thread name, from `py-spy dump` (a dev tool: {} without it)."""
    spy = shutil.which("py-spy") or str(Path(sys.executable).with_name("py-spy"))
    try:
        out = subprocess.run([spy, "dump", "-p", str(pid)], capture_output=True, text=True,
                             timeout=30).stdout
    except (OSError, subprocess.SubprocessError):
        return {}
    return {int(m.group(1)): m.group(2)
            for m in re.finditer(r'^Thread (\d+) \(\w+\): "([^"]*)"', out, re.M)}


def is_model_thread(name: str) -> bool:
    """The threads that run the model: the device thread and the CPU operators' pool."""
    return name.startswith(("device-", "cpu-op"))


def thread_group(name: str) -> str:
    """What a worker thread does, by its Python name."""
    if is_model_thread(name):
        return "model (device, cpu-op threads)"
    if name == "MainThread":
        return "Celery consumer (kombu, main thread)"
    if name.startswith("ThreadPoolExecutor"):
        return "Celery pool threads"
    if name == "runtime-loop":
        return "runtime loop (handler, leases, engine intake)"
    return "other threads"


def children(pid: int) -> list[int]:
    """Direct children of `pid`, from /proc."""
    out = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            raw = (entry / "stat").read_text()
        except OSError:
            continue
        if int(raw.rsplit(")", 1)[1].split()[1]) == pid:
            out.append(int(entry.name))
    return sorted(out)
