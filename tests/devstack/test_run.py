"""`make run` (services/devstack/run.py) as a newcomer starts it: local-only by default and
saying so, the worker metrics address it really uses, a quiet start, a second run on the
same state refused instead of taking the first one over, and a Ctrl-C that says what it waits
for, with a second one that stops at once and loses no job."""

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


def _redis_port(banner: str) -> str:
    line = next(x for x in banner.splitlines() if x.startswith("Redis:"))
    return line.split("redis://127.0.0.1:", 1)[1].split("/", 1)[0]


def test_a_local_run_is_local_says_so_starts_quietly_and_refuses_a_second_run(
        runner_env, tmp_path):
    api_port = int(runner_env["FIBERMILL_API_PORT"])
    log = tmp_path / "first.log"
    # The configured worker metrics port is taken (another stack's worker, say): the worker
    # takes a free one and the banner prints that one.
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", int(runner_env["FIBERMILL_WORKER_METRICS_PORT"])))
        taken.listen()
        first = _start(runner_env, log)
        try:
            banner = _wait_for(log, READY, first)
        except BaseException:
            first.kill()
            raise
    try:
        assert _listening_addresses(api_port) == {"127.0.0.1"}
        assert "listening on 127.0.0.1 only" in banner
        assert "API keys: off" in banner
        assert "webhooks to private addresses: allowed" in banner
        # The CLI calls :8000 unless told: this stack is on another port.
        assert f"export FIBERMILL_URL=http://127.0.0.1:{api_port}" in banner
        # The Redis this stack uses, not the one on 6379.
        assert (f"redis-cli -p {_redis_port(banner)} GET fm:webhook_secret" in banner)
        metrics_url = banner.split("worker metrics: ", 1)[1].split()[0]
        metrics_port = int(metrics_url.split(":")[2].split("/")[0])
        assert metrics_url == f"http://127.0.0.1:{metrics_port}/metrics"
        assert metrics_port != int(runner_env["FIBERMILL_WORKER_METRICS_PORT"])
        assert _listening_addresses(metrics_port) == {"127.0.0.1"}  # as the API: loopback
        with urllib.request.urlopen(metrics_url, timeout=5) as r:
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
        groups = _groups(runner_env)
        first.send_signal(signal.SIGINT)
        assert first.wait(timeout=90) == 0
    assert [g for g in groups if _group_alive(g)] == []  # everything it started has stopped
    stopped = log.read_text()
    assert stopped.count("stopping: no job is running; press Ctrl-C again to stop now") == 1
    assert [n for n in NOISE if n in stopped] == []


def _call(url: str, body: dict | None = None) -> dict:
    req = urllib.request.Request(url, method="POST" if body else "GET",
                                 headers={"Content-Type": "application/json"},
                                 data=json.dumps(body).encode() if body else None)
    with urllib.request.urlopen(req, timeout=10) as r:
        return json.loads(r.read())


def _group_alive(pgid: int) -> bool:
    """Whether any process of the group is left, after a moment for the init process to reap
    what it inherited (a worker whose launcher was killed)."""
    deadline = time.monotonic() + 3
    while True:
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            return False
        if time.monotonic() > deadline:
            return True
        time.sleep(0.1)


def _groups(env: dict[str, str]) -> list[int]:
    """The process groups the runner started (each child leads its own): Redis, the API, and
    the worker launcher with its workers."""
    return [int(p.read_text()) for p in Path(env["FIBERMILL_RUN_DIR"]).glob("*.pid")]


# A digits job of one image at many steps: still running when the runner is stopped.
LONG_JOB = {"model": "digits", "input": {"prompts": ["3"], "steps": 150, "seed": 1}}


def test_ctrl_c_says_what_it_waits_for_and_twice_stops_at_once_losing_no_job(
        runner_env, tmp_path):
    env = {**runner_env, "FIBERMILL_WORKER_MODELS": "digits"}
    base = f"http://127.0.0.1:{env['FIBERMILL_API_PORT']}"
    log = tmp_path / "first.log"
    first = _start(env, log)
    try:
        _wait_for(log, READY, first)
        groups = _groups(env)
        job_id = _call(f"{base}/v1/jobs", LONG_JOB)["id"]
        deadline = time.monotonic() + 60
        while _call(f"{base}/v1/jobs/{job_id}")["status"] != "running":
            assert time.monotonic() < deadline, "the job never started"
            time.sleep(0.1)

        first.send_signal(signal.SIGINT)
        _wait_for(log, "press Ctrl-C again", first, timeout=10)
        t0 = time.monotonic()
        first.send_signal(signal.SIGINT)
        assert first.wait(timeout=10) == 0
        took = time.monotonic() - t0
    finally:
        if first.poll() is None:
            first.kill()
            first.wait()
    stopped = log.read_text()
    assert ("stopping: waiting up to 25 s for 1 running job on worker cpu0 to finish or be "
            "handed back; press Ctrl-C again to stop now") in stopped
    assert "stopped at once" in stopped
    assert took < 5, stopped
    assert [g for g in groups if _group_alive(g)] == []  # the launcher and its workers too

    second_log = tmp_path / "second.log"
    second = _start(env, second_log)
    try:
        _wait_for(second_log, READY, second)
        deadline = time.monotonic() + 150
        while (job := _call(f"{base}/v1/jobs/{job_id}"))["status"] != "succeeded":
            assert job["status"] in ("queued", "running"), job
            assert time.monotonic() < deadline, job
            time.sleep(0.5)
    finally:
        second.send_signal(signal.SIGINT)
        second.wait(timeout=90)


def test_opened_to_the_network_it_says_who_can_reach_it():
    from services.devstack.run import exposure
    from shared.settings import Settings

    lines = exposure("0.0.0.0", Settings(api_keys="", webhook_allow_private=False))
    assert lines[0] == "listening on 0.0.0.0: reachable from the network"
    assert lines[1].startswith("API keys: OFF - anyone who reaches the port can submit jobs")
    assert lines[2] == "webhooks to private addresses: refused"
    assert exposure("0.0.0.0", Settings(api_keys="a,b"))[1] == "API keys: on (2 keys)"


def test_the_banner_hints_are_true_for_this_stack():
    from services.devstack.run import cli_hint, url_host, webhook_secret_hint
    from shared.settings import Settings

    assert cli_hint("http://127.0.0.1:8000") is None  # the CLI's default
    assert (cli_hint("http://127.0.0.1:8001") or "").startswith(
        "export FIBERMILL_URL=http://127.0.0.1:8001")
    assert url_host("0.0.0.0") == "127.0.0.1" and url_host("::1") == "[::1]"
    base, cli = "http://127.0.0.1:8001", "redis-cli -p 23456"
    open_api = webhook_secret_hint(Settings(api_keys="", webhook_secret=None), base, cli)
    assert "curl -s http://127.0.0.1:8001/v1/webhook-secret" in open_api
    assert "redis-cli -p 23456 GET fm:webhook_secret" in open_api
    # With API keys each key has its own secrets (services/api/webhooks/keyring.py), which
    # fm:webhook_secret is not.
    keyed = webhook_secret_hint(Settings(api_keys="k1"), base, cli)
    assert "fm:webhook_secret" not in keyed and "Authorization: Bearer <key>" in keyed
    assert "FIBERMILL_WEBHOOK_SECRET" in webhook_secret_hint(
        Settings(api_keys="", webhook_secret="whsec_" + "A" * 32), base, cli)


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


def test_a_redis_password_never_reaches_the_banner():
    from services.devstack.run import _without_password

    assert _without_password("redis://:s3cret@db.internal:6380/2") == (
        "redis://db.internal:6380/2", True)
    assert _without_password("rediss://app:s3cret@db:6379/0") == ("rediss://app@db:6379/0", True)
    assert _without_password("redis://127.0.0.1:6379/0") == ("redis://127.0.0.1:6379/0", False)
