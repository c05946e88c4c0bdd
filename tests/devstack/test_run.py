"""`make run` (services/devstack/run.py) as a newcomer starts it: local-only by default and
saying so, the worker metrics address it really uses, a quiet start, and a second run on the
same state refused instead of taking the first one over."""

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from services.devstack import run
from services.devstack.redis_server import free_port

READY = "Ctrl-C stops everything."
NOISE = ["superuser privileges", "torchvision", "Loading pipeline components", "Loading weights",
         "[queues]", "WARNING", "Traceback", "Task fibermill.run_subrequest"]


def _listening_addresses(port: int) -> set[str]:
    """Local addresses with a TCP socket listening on `port` (IPv4, from /proc)."""
    found = set()
    for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        local, state = line.split()[1], line.split()[3]
        addr, port_hex = local.split(":")
        if state == "0A" and int(port_hex, 16) == port:
            found.add(".".join(str(int(addr[i:i + 2], 16)) for i in (6, 4, 2, 0)))
    return found


def _start(env: dict[str, str], log: Path) -> subprocess.Popen:
    with log.open("w") as out:  # the child has its own copy of the descriptor
        return subprocess.Popen([sys.executable, "-m", "services.devstack.run"], env=env,
                                stdout=out, stderr=subprocess.STDOUT, start_new_session=True)


@pytest.fixture
def runner_env(tmp_path, model_dir) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("FIBERMILL_")}
    return {**env, "FIBERMILL_RUN_DIR": str(tmp_path / "run"),
            "FIBERMILL_API_PORT": str(free_port()),
            "FIBERMILL_WORKER_METRICS_PORT": str(free_port()),
            "FIBERMILL_MODEL_REGISTRY": str(model_dir / "registry.yaml"),
            "FIBERMILL_WORKER_MODELS": "tiny-gpt2", "FIBERMILL_CPU_WORKERS": "1"}


def _wait_for(log: Path, text: str, proc: subprocess.Popen, timeout: float = 180) -> str:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        out = log.read_text()
        if text in out:
            return out
        assert proc.poll() is None, out
        time.sleep(0.2)
    raise AssertionError(f"no {text!r} within {timeout}s:\n{log.read_text()}")


def test_a_local_run_is_local_says_so_starts_quietly_and_refuses_a_second_run(
        runner_env, tmp_path):
    api_port = int(runner_env["FIBERMILL_API_PORT"])
    metrics_port = runner_env["FIBERMILL_WORKER_METRICS_PORT"]
    log = tmp_path / "first.log"
    first = _start(runner_env, log)
    try:
        banner = _wait_for(log, READY, first)
        assert _listening_addresses(api_port) == {"127.0.0.1"}
        assert "listening on 127.0.0.1 only" in banner
        assert "API keys: off" in banner
        assert "webhooks to private addresses: allowed" in banner
        assert f"worker metrics: http://127.0.0.1:{metrics_port}/metrics" in banner
        with urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics", timeout=5) as r:
            assert b"fibermill_" in r.read()
        assert [n for n in NOISE if n in banner] == []
        job = urllib.request.Request(
            f"http://127.0.0.1:{api_port}/v1/jobs", method="POST", headers={
                "Content-Type": "application/json", "Prefer": "wait=60"},
            data=json.dumps({"model": "tiny-gpt2", "input": {"prompts": ["hi"]}}).encode())
        with urllib.request.urlopen(job, timeout=90) as r:
            assert json.loads(r.read())["status"] == "succeeded"

        second_log = tmp_path / "second.log"
        second = _start({**runner_env, "FIBERMILL_API_PORT": str(free_port())}, second_log)
        assert second.wait(timeout=60) == 1
        refusal = second_log.read_text()
        assert "another `make run` is using" in refusal
        assert f"API at http://127.0.0.1:{api_port}" in refusal
        with urllib.request.urlopen(f"http://127.0.0.1:{api_port}/readyz", timeout=5) as r:
            assert r.status == 200  # the first run is untouched
    finally:
        first.send_signal(signal.SIGINT)
        assert first.wait(timeout=90) == 0
    stopped = log.read_text()
    assert stopped.count("stopping...") == 1
    assert [n for n in NOISE if n in stopped] == []


def test_opened_to_the_network_it_says_who_can_reach_it():
    from services.devstack.run import exposure
    from shared.settings import Settings

    lines = exposure("0.0.0.0", Settings(api_keys="", webhook_allow_private=False))
    assert lines[0] == "listening on 0.0.0.0: reachable from the network"
    assert lines[1].startswith("API keys: OFF - anyone who reaches the port can submit jobs")
    assert lines[2] == "webhooks to private addresses: refused"
    assert exposure("0.0.0.0", Settings(api_keys="a,b"))[1] == "API keys: on (2 keys)"


# The free-port probe -------------------------------------------------------------------------


def _tcp_states(port: int) -> set[str]:
    """The states (hex, as /proc/net/tcp writes them) of the IPv4 TCP sockets bound to
    `port`: 0A listening, 06 TIME_WAIT."""
    states = set()
    for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        fields = line.split()
        if int(fields[1].split(":")[1], 16) == port:
            states.add(fields[3])
    return states


def _listener() -> socket.socket:
    """A listener bound as uvicorn binds (SO_REUSEADDR), on a port of its own."""
    lis = socket.socket()
    lis.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    lis.bind(("127.0.0.1", 0))
    lis.listen()
    return lis


def test_a_port_left_in_time_wait_by_a_stopped_server_is_free():
    lis = _listener()
    port = lis.getsockname()[1]
    client = socket.create_connection(("127.0.0.1", port))
    served, _ = lis.accept()
    served.close()  # the server side closes first, so its end of the connection lingers
    assert client.recv(1) == b""  # the server's FIN arrived
    client.close()
    lis.close()  # the server is gone; only its connection's TIME_WAIT is left
    deadline = time.monotonic() + 5
    while _tcp_states(port) != {"06"} and time.monotonic() < deadline:
        time.sleep(0.01)  # the kernel's last ACK of the handshake, not a process to await
    assert _tcp_states(port) == {"06"}
    with socket.socket() as plain, pytest.raises(OSError):
        plain.bind(("127.0.0.1", port))  # a bind without SO_REUSEADDR is refused here

    assert run._port_in_use("127.0.0.1", port) is False


def test_a_port_with_a_live_listener_is_in_use():
    with _listener() as lis:
        assert run._port_in_use("127.0.0.1", lis.getsockname()[1]) is True
