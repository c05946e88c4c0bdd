"""The worker's /metrics server: on the host it is given, on a free port when the configured
one is taken, and the port it is bound to written down for `make run` to print."""

import socket
import urllib.request
from pathlib import Path

from services.worker.metrics_server import reported_ports, serve_metrics
from shared.settings import Settings


def _listening(port: int) -> set[str]:
    """Local IPv4 addresses with a socket listening on `port` (from /proc)."""
    found = set()
    for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        local, state = line.split()[1], line.split()[3]
        addr, port_hex = local.split(":")
        if state == "0A" and int(port_hex, 16) == port:
            found.add(".".join(str(int(addr[i:i + 2], 16)) for i in (6, 4, 2, 0)))
    return found


def _scrape(port: int) -> bytes:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
        return r.read()


def test_a_taken_port_gives_a_free_one_on_the_host_asked_and_says_which(tmp_path):
    with socket.socket() as taken:  # another stack's worker holds the configured port
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        settings = Settings(worker_metrics_port=port, worker_metrics_host="127.0.0.1",
                            worker_metrics_port_dir=str(tmp_path / "metrics"), device_index=1)

        bound = serve_metrics(port, settings)

        assert bound is not None and bound != port
        assert reported_ports(tmp_path / "metrics") == {1: bound}
        assert _listening(bound) == {"127.0.0.1"}  # loopback, not every interface
        assert b"fibermill_device_memory_allocated_bytes" in _scrape(bound)


def test_a_free_port_is_served_as_configured(tmp_path):
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    settings = Settings(worker_metrics_port=port, worker_metrics_host="127.0.0.1",
                        worker_metrics_port_dir=str(tmp_path))

    assert serve_metrics(port, settings) == port
    assert reported_ports(tmp_path) == {0: port}


def test_port_zero_turns_metrics_off_on_every_worker(tmp_path):
    # celery_app asks for the port + the device index: worker 1 of a stack with metrics off
    # must not serve on port 1.
    settings = Settings(worker_metrics_port=0, worker_metrics_host="127.0.0.1",
                        worker_metrics_port_dir=str(tmp_path), device_index=1)

    assert serve_metrics(0 + 1, settings) is None
    assert reported_ports(tmp_path) == {}
