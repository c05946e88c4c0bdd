"""Serve the worker's /metrics on its own port: the counters and histograms of
services/worker/metrics.py, and the device memory read at scrape time (device_metrics.py).

It listens on FIBERMILL_WORKER_METRICS_HOST (every interface by default, for Prometheus to
scrape a pod; `make run` gives it the API's host). When the configured port is taken (a second
`make run` on the same machine) it takes a free one instead, and writes the port it is bound
to where FIBERMILL_WORKER_METRICS_PORT_DIR says, for whoever started it to print."""

import logging
import os
from pathlib import Path

from prometheus_client import start_http_server

from services.worker.device_metrics import register_device_metrics
from shared.settings import Settings, get_settings

log = logging.getLogger(__name__)


def serve_metrics(port: int, settings: Settings | None = None) -> int | None:
    """Serve on `port` (or a free one when it is taken); the port bound, None when off."""
    settings = settings or get_settings()
    if settings.worker_metrics_port <= 0 or port <= 0:  # 0 turns the worker's /metrics off
        return None
    register_device_metrics()
    host = settings.worker_metrics_host
    try:
        bound = _start(host, port)
    except OSError as exc:
        try:
            bound = _start(host, 0)
        except OSError:  # a busy port must not keep the worker from serving jobs
            log.warning("worker metrics not served on %s:%d: %s", host, port, exc)
            return None
        # Expected under `make run` (a second stack on the machine), which reads the port
        # reported below; elsewhere nobody learns the new port, and a scraper misses it.
        log.log(logging.INFO if settings.worker_metrics_port_dir else logging.WARNING,
                "worker metrics port %d is taken (%s); serving on %d instead", port, exc, bound)
    log.info("worker metrics on %s:%d/metrics", host, bound)
    if settings.worker_metrics_port_dir:
        report_port(Path(settings.worker_metrics_port_dir), settings.device_index, bound)
    return bound


def _start(host: str, port: int) -> int:
    server, _thread = start_http_server(port, addr=host)
    return int(server.server_port)


def report_port(directory: Path, device_index: int, port: int) -> None:
    """Write `<device index>.port` in `directory`, whole or not at all (a reader polls it)."""
    directory.mkdir(parents=True, exist_ok=True)
    tmp = directory / f".{device_index}.port.{os.getpid()}"
    tmp.write_text(f"{port}\n")
    tmp.replace(directory / f"{device_index}.port")


def reported_ports(directory: Path) -> dict[int, int]:
    """The ports the workers wrote with `report_port`, by device index."""
    found = {}
    for path in directory.glob("*.port"):
        try:
            found[int(path.stem)] = int(path.read_text())
        except ValueError:
            continue
    return found
