"""One line per HTTP request, at INFO, once its answer is sent: method, path, status, duration
and the client's address. It replaces uvicorn's access log, which has no duration and a format
of its own.

Probes and scrapes (`/healthz`, `/readyz`, `/metrics`) log at DEBUG, whatever they answer: a
load balancer and Prometheus ask every few seconds (and /readyz answers 503 while no worker is
up, or through a drain), which would bury the requests an operator looks for. The
query string is left out (the path names the resource; a query may carry what a client did not
mean to have logged).
"""

import logging
import time
from typing import Any

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from shared.logs import fields

log = logging.getLogger("fibermill.access")

QUIET_PATHS = frozenset({"/healthz", "/readyz", "/metrics"})


class AccessLog:
    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        start = time.perf_counter()
        status = 500  # what the client sees when the app raises before it answers

        async def sending(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, sending)
        finally:
            _line(scope, status, time.perf_counter() - start)


def _line(scope: Scope, status: int, seconds: float) -> None:
    path = scope.get("path", "")
    level = logging.DEBUG if path in QUIET_PATHS else logging.INFO
    if not log.isEnabledFor(level):
        return
    client: Any = scope.get("client")
    peer = f"{client[0]}:{client[1]}" if client else "-"
    method = scope.get("method", "")
    millis = seconds * 1000
    log.log(level, "%s %s %d %.1fms %s", method, path, status, millis, peer,
            extra=fields(method=method, path=path, status=status,
                         duration_ms=round(millis, 3), client=peer))
