"""Work around Python 3.11's asyncio.wait_for swallowing a cancellation."""

import asyncio


def raise_if_cancelled() -> None:
    """redis-py runs its socket timeout through asyncio.wait_for, which on Python 3.11 can drop a
    cancellation that arrives as a command completes (CPython gh-86296, fixed in 3.12). The task
    still counts it, so a background loop that calls this once a pass stops when asked."""
    task = asyncio.current_task()
    if task is not None and task.cancelling():
        raise asyncio.CancelledError
