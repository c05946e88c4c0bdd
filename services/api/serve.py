"""Run the API under uvicorn with a graceful drain: `python -m services.api.serve`.

uvicorn closes its listening socket the moment SIGTERM arrives, while a load balancer may go on
sending new connections for a few seconds; this server first answers 503 on `/readyz` for
`FIBERMILL_API_DRAIN_SECONDS`, then lets uvicorn shut down gracefully. The whole sequence, and
how to size the pod's grace period, is in docs/architecture.md ("Drain (SIGTERM)").
"""

import argparse
import gc
import logging
import signal
import socket
import sys
import time
from types import FrameType

import uvicorn
from fastapi import FastAPI

from services.api.access_log import AccessLog
from shared.logs import configure as configure_logs
from shared.settings import get_settings

log = logging.getLogger("uvicorn.error")


class DrainingServer(uvicorn.Server):
    def __init__(self, config: uvicorn.Config, app: FastAPI, drain_seconds: float) -> None:
        super().__init__(config)
        self.app = app
        self.drain_seconds = drain_seconds
        self.drain_started: float | None = None
        app.state.draining = False

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        # Runs in a signal handler: only flags, read by the loop's next tick. uvicorn's own
        # handler would also remember the signal and raise it again after shutdown (an exit
        # by SIGTERM); a drained API exits 0 instead.
        self.app.state.draining = True
        if self.should_exit:
            self.force_exit = True  # a signal during the shutdown: stop waiting for requests
        elif sig == signal.SIGTERM and self.drain_started is None and self.drain_seconds > 0:
            self.drain_started = time.monotonic()
            log.warning("SIGTERM: /readyz answers 503; shutting down in %.1fs",
                        self.drain_seconds)
        else:
            self.should_exit = True

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        await super().startup(sockets)
        # What is imported and built by now (the app, its clients, the lifespan's state) lives
        # as long as the process: out of the collector's full passes, which otherwise walk all
        # of it every few hundred requests (docs/architecture.md, "The API's collector").
        gc.freeze()

    async def on_tick(self, counter: int) -> bool:
        if (self.drain_started is not None and not self.should_exit
                and time.monotonic() - self.drain_started >= self.drain_seconds):
            log.warning("drain delay over: closing the socket, finishing requests in flight")
            self.should_exit = True
        return await super().on_tick(counter)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m services.api.serve", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--log-level", default=None,
                   help="level of uvicorn's own messages (server start and stop); "
                        "default: FIBERMILL_LOG_LEVEL, which sets every other line's, "
                        "the request lines' included")
    p.add_argument("--timeout-graceful-shutdown", type=float, default=None,
                   help="seconds requests in flight get once the socket is closed "
                        "(default: FIBERMILL_MAX_WAIT_SECONDS + 5)")
    p.add_argument("--drain-seconds", type=float, default=None,
                   help="override FIBERMILL_API_DRAIN_SECONDS")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    settings = get_settings()
    configure_logs("api")
    from services.api.app import app

    timeout = args.timeout_graceful_shutdown
    if timeout is None:
        timeout = settings.max_wait_seconds + 5
    # uvicorn installs no logging of its own (log_config None): its records go through
    # shared/logs.py's format, and AccessLog writes the request lines in place of its access
    # log.
    config = uvicorn.Config(AccessLog(app), host=args.host, port=args.port,
                            log_level=(args.log_level or settings.log_level).lower(),
                            log_config=None, access_log=False,
                            timeout_graceful_shutdown=max(0.0, timeout))
    drain = settings.api_drain_seconds if args.drain_seconds is None else args.drain_seconds
    server = DrainingServer(config, app, drain)
    server.run()  # exits 3 itself if the app cannot start
    return 0


if __name__ == "__main__":
    sys.exit(main())
