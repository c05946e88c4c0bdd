"""Serve the worker's /metrics on its own port."""

import logging

from prometheus_client import start_http_server

log = logging.getLogger(__name__)


def serve_metrics(port: int) -> None:
    if port <= 0:
        return
    try:
        start_http_server(port, addr="0.0.0.0")
        log.info("worker metrics on :%d/metrics", port)
    except OSError as exc:  # a busy port must not keep the worker from serving jobs
        log.warning("worker metrics not served on port %d: %s", port, exc)
