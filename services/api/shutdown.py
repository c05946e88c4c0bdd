"""Stopping the API's background work within a bound.

A replica that is asked to stop must stop: Kubernetes kills it after its grace period anyway,
and a shutdown that waits forever on one stuck step (a loop that swallowed its cancellation, a
socket close that never completes) hides which step it was. Each step gets a bound; one that
overruns is logged with its name (and, for a task, where it is stuck) and left behind.
"""

import asyncio
import logging
from collections.abc import Awaitable

log = logging.getLogger(__name__)

STEP_SECONDS = 5.0


async def stop_tasks(tasks: list[asyncio.Task], seconds: float = STEP_SECONDS) -> None:
    for t in tasks:
        t.cancel()
    _done, pending = await asyncio.wait(tasks, timeout=seconds)
    for t in pending:
        log.error("the %s loop did not stop within %.0fs of its cancellation; left behind at:"
                  "\n%s", t.get_name(), seconds, awaiting(t))


def awaiting(task: asyncio.Task) -> str:
    """Where a task waits, down its whole chain of awaits (a task's own stack shows only its
    outermost coroutine)."""
    lines = []
    # Each link is a coroutine, an async generator or an awaitable: read by attribute.
    coro: object = task.get_coro()
    while coro is not None:
        frame = getattr(coro, "cr_frame", None) or getattr(coro, "ag_frame", None)
        if frame is not None:
            lines.append(f"  {frame.f_code.co_filename}:{frame.f_lineno} in "
                         f"{frame.f_code.co_name}")
        coro = getattr(coro, "cr_await", None) or getattr(coro, "ag_await", None)
    return "\n".join(lines)


async def bounded(step: str, work: Awaitable[object], seconds: float = STEP_SECONDS) -> None:
    try:
        async with asyncio.timeout(seconds):
            await work
    except TimeoutError:
        log.error("%s took longer than %.0fs at shutdown; left behind", step, seconds)
