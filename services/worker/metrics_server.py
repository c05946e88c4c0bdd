"""Serve the worker's /metrics on its own port: the counters and histograms of
services/worker/metrics.py, and the device memory read at scrape time (device_metrics.py)."""

import logging

from prometheus_client import start_http_server

from services.worker.device_metrics import register_device_metrics

log = logging.getLogger(__name__)


def serve_metrics(port: int) -> None:
    if port <= 0:
        return
    register_device_metrics()
    try:
        start_http_server(port, addr="0.0.0.0")
        log.info("worker metrics on :%d/metrics", port)
    except OSError as exc:  # a busy port must not keep the worker from serving jobs
        log.warning("worker metrics not served on port %d: %s", port, exc)
