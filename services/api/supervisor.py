"""Background loops that cannot die: the joiner, the janitor, the webhook sender and the event
hub each run under a supervisor that restarts them with backoff after any error (Redis down at
start included), and says whether they are running, for `/readyz`."""

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable

log = logging.getLogger(__name__)

BACKOFF_SECONDS = (0.5, 1.0, 2.0, 5.0, 10.0)
# A loop that ran this long was healthy: its next failure starts the backoff over.
HEALTHY_SECONDS = 60.0


class Supervised:
    def __init__(self, name: str, loop: Callable[[], Awaitable[None]]) -> None:
        self.name = name
        self._loop = loop
        self.running = False
        self.restarts = 0
        self.last_error: str | None = None

    async def run(self) -> None:
        failures = 0
        while True:
            started = time.monotonic()
            self.running = True
            try:
                await self._loop()
                raise RuntimeError(f"the {self.name} loop returned")  # it never should
            except asyncio.CancelledError:
                self.running = False
                raise
            except Exception as exc:
                self.running = False
                self.last_error = f"{type(exc).__name__}: {exc}"
                self.restarts += 1
                if time.monotonic() - started >= HEALTHY_SECONDS:
                    failures = 0
                delay = BACKOFF_SECONDS[min(failures, len(BACKOFF_SECONDS) - 1)]
                failures += 1
                log.error("the %s loop failed (%s); restarting in %.1fs", self.name,
                          self.last_error, delay, exc_info=True)
                await asyncio.sleep(delay)


def stopped(loops: list[Supervised]) -> list[Supervised]:
    return [s for s in loops if not s.running]
